"""The backend's own operators (add-op DEVICE::NAME --schema), autograd overrides (add-op aten::OP
--autograd) and the autocast table (amp list/set): planning and refusals without a build, and the
whole path on a built backend."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ensure_installed, run_cli

from backendgen import api
from backendgen.kinds import customop
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.project import manifest

REGISTRATION_FILE = manifest.load().path("registration")  # where the current template puts it


@pytest.fixture
def project(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    return root


def _device(root):
    return json.loads((root / "backendgen.json").read_text())["device"]


@pytest.mark.parametrize(
    "name, schema, body, autograd, message",
    [
        ("Scale", "(Tensor x) -> Tensor", None, False, "invalid operator name"),
        ("scale.out", "(Tensor x) -> Tensor", None, False, "invalid operator name"),
        ("scale", "", None, False, "give its schema"),
        ("scale", "(Tensor x -> Tensor", None, False, "rejected by torchgen"),
        ("scale", "(Tensor x, Stream s) -> Tensor", None, False, "not supported"),
        ("scale_", "(Tensor(a!) self) -> Tensor(a!)", None, True, "functional operators only"),
        ("scale", "(Tensor x) -> (Tensor, Tensor)", None, True, "return one Tensor"),
        ("scale", "(float x) -> Tensor", "at::ones({1}) * x", True, "nothing to differentiate"),
        ("scale", "(Tensor[] xs) -> Tensor", "xs[0] * 2", True, "does not support Tensor"),
        ("scale", "(Tensor(a)[] xs) -> Tensor", "xs[0] * 2", True, "does not support Tensor"),
        ("scale", "(Tensor x) -> Tensor", "x *\n2", False, "on one line"),
        ("scale", "(Tensor x) -> Tensor", "at::sin(x", False, "unbalanced"),
    ],
)
def test_parse_refuses_with_the_reason(name, schema, body, autograd, message):
    with pytest.raises(UserError, match=message):
        customop.parse("chip", name, schema, body=body, autograd=autograd)


def test_kernels_follow_the_schema():
    c = customop.parse("chip", "chip::scale", "(Tensor x, float alpha=1.0) -> Tensor", body="x * alpha", autograd=True)
    assert c.keys == ["PrivateUse1", "CPU", "Meta", "Autograd"]
    kernel = customop.render_kernel(c)
    assert "at::Tensor compute(const at::Tensor & x, double alpha) {\n  return x * alpha;" in kernel
    assert "kernels::host_alias(x), alpha" in kernel and "---- device computation" in kernel
    assert "::apply(x, alpha)" in customop.render_autograd(c)
    # an in-place schema returns its argument and gets PyTorch's ADInplaceOrView kernel
    inplace = customop.parse(
        "chip", "scale_", "(Tensor(a!) self, float alpha=1.0) -> Tensor(a!)", body="self.mul_(alpha)"
    )
    assert "ADInplaceOrView" in inplace.keys
    assert "(void)(self.mul_(alpha));\n  return self;" in customop.render_kernel(inplace)
    # without a body every kernel raises, naming the file; the Meta kernel still knows the shape
    todo = customop.parse("chip", "todo", "(Tensor x) -> Tensor")
    text = customop.render_kernel(todo)
    assert (
        'C10_THROW_ERROR(NotImplementedError, "chip::todo is not defined yet: '
        'write compute() in csrc/custom_ops/todo.cpp")'
    ) in text
    assert "return at::empty_like(x);" in text


@pytest.mark.parametrize("aten", ["mul.out", "add.Tensor", "topk.values", "abs_", "sum.dim_IntList"])
def test_an_own_operator_is_typed_as_the_aten_operator_of_its_schema(aten):
    """One constructor (opdb.Op.of) types both: an own operator with an ATen operator's schema has its
    arguments, returns and C++ signature. (These take no tensor list and their yaml entries do not set
    use_const_ref_for_mutable_tensors, the two torchgen settings an own operator fixes; an own
    operator's Arg.schema_type keeps its alias annotation, so it is not compared.)"""
    from backendgen.torchdb.opdb import load_opdb

    op = load_opdb().resolve(aten)
    own = customop.parse("chip", op.base, op.schema[op.schema.index("(") :]).op

    def typed(o):
        return [(a.name, a.cpp_type, a.kind, a.is_write, a.is_out, a.default, a.alias_set) for a in o.args]

    assert typed(own) == typed(op)
    for field in ("kind", "returns", "return_items", "returns_cpp"):
        assert getattr(own, field) == getattr(op, field), field
    assert own.signature.replace(" NAME(", f" {op.cpp_name}(", 1) == op.signature
    assert own.qualified == f"chip::{op.base}" and op.qualified == f"aten::{op.name}"


def test_add_custom_op_writes_its_files_and_registration(project):
    dev = _device(project)
    res = api.add_ops(
        [f"{dev}::scale"],
        project,
        schema="(Tensor x, float alpha=1.0) -> Tensor",
        body="x * alpha",
        autograd=True,
        build_it=False,
    )
    assert res.added == [f"{dev}::scale"]
    pkg = json.loads((project / "backendgen.json").read_text())["package"]
    for rel in (
        "csrc/custom_ops/scale.cpp",
        f"csrc/autograd/{dev}_scale.cpp",
        f"{pkg}/ops/scale.py",
        f"tests/ops/test_{dev}_scale.py",
    ):
        assert (project / rel).is_file(), rel
    reg = (project / REGISTRATION_FILE).read_text()
    assert 'm.def(R"schema(scale(Tensor x, float alpha=1.0) -> Tensor)schema");' in reg
    for key in ("PrivateUse1", "CPU", "Meta", "Autograd"):
        assert f"TORCH_LIBRARY_IMPL({dev}, {key}, m)" in reg
    # again: nothing to do; a different schema for the same name is refused
    assert api.add_ops([f"{dev}::scale"], project, build_it=False).unchanged == [f"{dev}::scale"]
    with pytest.raises(ProjectError, match="already defined"):
        api.add_ops([f"{dev}::scale"], project, schema="(Tensor x) -> Tensor", build_it=False)


def test_refusals_leave_the_project_unchanged(project):
    dev = _device(project)
    before = (project / "backendgen.json").read_text()
    out = run_cli("add-op", "other::scale", "--schema", "(Tensor x) -> Tensor", "--project", str(project))
    assert out.returncode == 2 and "this backend's namespace" in out.stderr
    out = run_cli("add-op", f"{dev}::a", f"{dev}::b", "--schema", "(Tensor x) -> Tensor", "--project", str(project))
    assert out.returncode == 2 and "exactly one" in out.stderr
    out = run_cli("add-op", "aten::mul.out", "--autograd", "--project", str(project))
    assert out.returncode == 2 and "writes its arguments" in out.stderr
    out = run_cli("amp", "set", "mm", "bf16", "--project", str(project))
    assert out.returncode == 2 and "unknown autocast policy" in out.stderr
    assert (project / "backendgen.json").read_text() == before


def test_older_template_is_refused(project):
    meta = json.loads((project / "backendgen.json").read_text())
    meta["template_version"] = "6"
    del meta["amp"]
    (project / "backendgen.json").write_text(json.dumps(meta))
    out = run_cli("add-op", f"{meta['device']}::scale", "--schema", "(Tensor x) -> Tensor", "--project", str(project))
    assert out.returncode == 2 and "template 7" in out.stderr
    out = run_cli("amp", "list", "--project", str(project))
    assert out.returncode == 2 and "autocast.cpp" in out.stderr


def test_amp_list_shows_the_table(project):
    out = run_cli("amp", "list", "--project", str(project))
    assert out.returncode == 0, out.stderr
    assert "aten::mm" in out.stdout and "lower_precision_fp" in out.stdout and "aten::layer_norm" in out.stdout
    # torch.autocast("<device>") with no dtype gives float16 for a PrivateUse1 device: the table says so
    assert "float16 unless" in " ".join(out.stdout.split()) and "bfloat16 by default" not in out.stdout


@pytest.mark.slow
def test_custom_op_override_and_amp_on_a_built_backend(documented_project):
    """The issue's end-to-end path: the own operator, the override and the policy, each command
    building and running its tests as README documents them. The commands are the docs' own,
    run once in a copy of the session's project (conftest's documented_project, which
    tests/test_docs.py asserts succeeded); this test reads what they left."""
    root = ensure_installed(documented_project.root)
    dev = _device(root)
    ran = dict(documented_project.runs)
    for command in (
        'backendgen add-op mychip::scale --schema "(Tensor x, float alpha=1.0) -> Tensor" '
        '--body "x * alpha + at::sin(x)" --autograd',
        "backendgen add-op aten::hypot --autograd",
        "backendgen amp set aten::add.Tensor lower_precision_fp",
    ):
        assert command in ran, f"the docs no longer run `{command}`: tests/test_docs.py IN_COPY"
        out = ran[command]
        assert out.returncode == 0 and "built and tested" in out.stdout, f"{command}: {out.stdout}{out.stderr}"
    # the generated tests, run again together: gradcheck, FakeTensorMode, torch.compile(aot_eager),
    # the override's graph and gradients, the autocast policy
    tests = [f"tests/ops/test_{dev}_scale.py", "tests/ops/test_autograd_hypot.py", "tests/test_amp_policies.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (
        "test_gradcheck_on_the_device PASSED"
        in subprocess.run(
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", tests[0], "-k", "gradcheck"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout
    )
    # the override's default backward is eager-only: under torch.compile it says which file to write
    pkg = json.loads((root / "backendgen.json").read_text())["package"]
    script = (
        f"import torch, {pkg}\n"
        f"x = torch.rand(3, device='{dev}', requires_grad=True)\n"
        "y = torch.rand(3, device=x.device)\n"
        "torch.hypot(x, y).sum().backward()\n"
        "assert torch.allclose(x.grad.cpu(), x.detach().cpu() / torch.hypot(x, y).detach().cpu())\n"
        "f = torch.compile(lambda a, b: torch.hypot(a, b).sum(), backend='aot_eager')\n"
        "try:\n"
        "    f(x, y).backward()\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NotImplementedError" in proc.stdout and "csrc/autograd/hypot.cpp" in proc.stdout, proc.stdout[-2000:]
    out = run_cli("check", "--json", "--project", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    subjects = {f["subject"] for f in report["findings"] if f["severity"] == "ok"}
    assert f"{dev}::*" in subjects
    # the table's test fails when the table and the library disagree (backendgen.json is put back
    # after: the project is the session's documented copy)
    recorded = (root / "backendgen.json").read_text()
    try:
        _tables_disagree_with_the_library(root, dev)
    finally:
        (root / "backendgen.json").write_text(recorded)


def _tables_disagree_with_the_library(root, dev):
    meta = json.loads((root / "backendgen.json").read_text())
    meta["amp"]["mm"] = "fp32"
    (root / "backendgen.json").write_text(json.dumps(meta))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_amp_policies.py"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "[mm]" in proc.stdout
    # and check finds a recorded operator the library does not register
    meta["custom_ops"].append({**meta["custom_ops"][0], "op": f"{dev}::ghost", "schema": "ghost(Tensor x) -> Tensor"})
    (root / "backendgen.json").write_text(json.dumps(meta))
    out = run_cli("check", "--json", "--project", str(root))
    assert out.returncode == 1
    assert any(f["subject"] == f"{dev}::ghost" and f["severity"] == "error" for f in json.loads(out.stdout)["findings"])


def test_remove_op_takes_back_an_operator_and_an_override(project):
    dev = _device(project)
    api.add_ops([f"{dev}::scale"], project, schema="(Tensor x) -> Tensor", body="x * 2", autograd=True, build_it=False)
    api.add_ops(["aten::hypot"], project, autograd=True, build_it=False)
    out = run_cli("remove-op", "hypot", "--project", str(project))  # a kernel, not the override, without --autograd
    assert out.returncode == 2 and "has no kernel" in out.stderr
    out = run_cli("remove-op", f"{dev}::scale", "aten::hypot", "--autograd", "--project", str(project))
    assert out.returncode == 0, out.stderr
    meta = json.loads((project / "backendgen.json").read_text())
    assert meta["custom_ops"] == [] and meta["autograd_overrides"] == []
    assert (
        not (project / "csrc/custom_ops/scale.cpp").exists()
        and not (project / f"csrc/autograd/{dev}_scale.cpp").exists()
    )
    assert not (project / "csrc/autograd/hypot.cpp").exists()
    reg = (project / REGISTRATION_FILE).read_text()
    assert "custom::scale" not in reg and "AutogradPrivateUse1" not in reg
    # and it can be defined again
    assert api.add_ops([f"{dev}::scale"], project, schema="(Tensor x) -> Tensor", build_it=False).added == [
        f"{dev}::scale"
    ]


def test_remove_op_refuses_an_edited_operator_unless_forced(project):
    dev = _device(project)
    api.add_ops([f"{dev}::scale"], project, schema="(Tensor x) -> Tensor", build_it=False)
    kernel = project / "csrc/custom_ops/scale.cpp"
    kernel.write_text(kernel.read_text() + "// mine\n")
    out = run_cli("remove-op", f"{dev}::scale", "--project", str(project))
    assert out.returncode == 2 and "changed since add-op wrote it" in out.stderr and kernel.exists()
    out = run_cli("remove-op", f"{dev}::scale", "--force", "--project", str(project))
    assert out.returncode == 0 and not kernel.exists()
    assert [p.name for p in kernel.parent.glob("scale.cpp.removed-*")]


def test_check_reports_a_custom_operator_typed_differently_by_this_torch(project):
    """After a torch upgrade whose torchgen types a schema differently (simulated: the recorded
    signature is what an older torchgen would have written), check names the kernel file to edit."""
    dev = _device(project)
    api.add_ops([f"{dev}::scale"], project, schema="(Tensor x, SymInt n) -> Tensor", build_it=False)
    meta = json.loads((project / "backendgen.json").read_text())
    rec = meta["custom_ops"][0]
    assert rec["signature"] == "at::Tensor scale(const at::Tensor & x, c10::SymInt n)"
    rec["signature"] = "at::Tensor scale(const at::Tensor & x, int64_t n)"
    (project / "backendgen.json").write_text(json.dumps(meta))
    out = run_cli("check", "--json", "--project", str(project))
    findings = [f for f in json.loads(out.stdout)["findings"] if f["subject"] == f"{dev}::scale"]
    assert any(
        f["severity"] == "error"
        and f["detail"].get("kind") == "signature_changed"
        and "csrc/custom_ops/scale.cpp" in f["message"]
        for f in findings
    ), findings
