"""Generated kernels compile against the generated project's narrow kernel_support.h, for every
C++ argument and return type the generator accepts. The types come from the installed torch's
operators (one operator per type), not from a list kept here; each kernel is compiled on its own
(-fsyntax-only), as `<DEVICE>_UNITY_BUILD=0` would, so no other file's includes can hide a missing one."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backendgen.kinds import kernelgen
from backendgen.plumbing.errors import BackendgenError
from backendgen.torchdb.opdb import load_opdb

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")


def _types(op) -> set[str]:
    return {"return " + op.returns_cpp} | {a.cpp_type for a in op.args}


def _one_plan_per_type(db):
    seen, plans = set(), []
    for op in db.all():
        try:
            plan = kernelgen.plan_kernel(db, op)
            kernelgen.kernel_body(plan.target)
        except BackendgenError:
            continue
        new = _types(plan.target) - seen
        if new and plan.target.qualified not in {p.target.qualified for p in plans}:
            seen |= new
            plans.append(plan)
    return plans


def test_every_argument_and_return_type_compiles_on_its_own(rendered_project, tmp_path):
    db = load_opdb()
    plans = _one_plan_per_type(db)
    assert len(plans) >= 20  # the torch has that many kinds of argument; fewer means the scan broke
    # and view kernels of each shape: a dtype-changing view, a list of views, a view with a device check
    plans += [
        kernelgen.plan_kernel(db, db.resolve(n))
        for n in ("view_as_real", "unbind.int", "_make_dual")
        if db.resolve(n).qualified not in {p.target.qualified for p in plans}
    ]
    device = "kc"  # the kernels' namespace; any identifier
    torch_inc = db.info.torchgen_dir.parent / "torch" / "include"
    flags = ["-std=c++20", "-fsyntax-only", f"-I{torch_inc}", f"-I{torch_inc / 'torch/csrc/api/include'}"]
    files = []
    for plan in plans:
        path = tmp_path / f"{plan.file_stem}.cpp"
        path.write_text(
            kernelgen.render_kernel(plan, device=device, source_path=path.name, torch_version=db.torch_version)
        )
        files.append(path)
    # kernel_support.h of the rendered project, under the namespace the kernels use
    support = (rendered_project / "csrc" / "aten" / "kernel_support.h").read_text()
    ns = re.search(r"namespace (\w+)::kernels", support).group(1)
    (tmp_path / "aten").mkdir()
    (tmp_path / "aten" / "kernel_support.h").write_text(
        support.replace(f"namespace {ns}::kernels", f"namespace {device}::kernels")
    )
    # and runtime/generator.h, which random kernels include (runtime::reserve)
    generator = (rendered_project / "csrc" / "runtime" / "generator.h").read_text()
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "generator.h").write_text(
        generator.replace(f"namespace {ns}::runtime", f"namespace {device}::runtime")
    )
    # Every kernel file includes kernel_support.h first, so gcc reads it from a precompiled copy
    # beside it: the same declarations, parsed once (the files then take 1-6 s each, not 5-10).
    # Without one (another compiler, a failed precompile) each file parses the header itself.
    subprocess.run(
        [
            "c++",
            *[f for f in flags if f != "-fsyntax-only"],
            "-x",
            "c++-header",
            "-w",
            str(tmp_path / "aten" / "kernel_support.h"),
        ],
        capture_output=True,
    )

    def compile_one(path: Path):
        out = subprocess.run(["c++", *flags, f"-I{tmp_path}", str(path)], capture_output=True, text=True)
        errors = [line for line in out.stderr.splitlines() if "error" in line]
        return path.name, out.returncode, errors[:3]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, files))
    failed = [(name, errors) for name, rc, errors in results if rc != 0]
    assert failed == [], failed
