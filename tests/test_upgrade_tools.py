"""The upgrade's fix steps: `backendgen remove-op` and `backendgen check --accept` (docs/upgrading.md).
The real 2.13.0 -> 2.14.1 upgrade runs in tests/test_torch_matrix.py."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_cli

from backendgen import api
from backendgen.kinds import registration
from backendgen.plumbing.errors import ProjectError
from backendgen.project.on_disk import Project


@pytest.fixture
def with_kernels(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    api.add_ops(["abs.out", "topk"], root, build_it=False)
    return root


def _ops(root):
    return {d["op"] for d in json.loads((root / "backendgen.json").read_text())["ops"]}


def test_remove_op_removes_kernel_test_registration_and_record(with_kernels):
    root = with_kernels
    out = run_cli("remove-op", "abs", "--project", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed csrc/aten/ops/abs.cpp" in out.stdout and "aten::abs.out" in out.stdout
    assert not (root / "csrc/aten/ops/abs.cpp").exists() and not (root / "tests/ops/test_abs.py").exists()
    assert not any("abs" in op for op in _ops(root)) and "aten::topk.values" in _ops(root)
    files = [(root / rel).read_text() for rel in registration.paths(Project.load(root))]
    assert all(registration.is_pristine(text) for text in files)
    reg = "".join(files)
    assert '"abs.out"' not in reg and '"topk.values"' in reg
    # and it can be added again
    assert api.add_ops(["abs.out"], root, build_it=False).added == ["aten::abs.out"]


def test_remove_op_refuses_an_edited_kernel_unless_forced_and_keeps_a_copy(with_kernels):
    root = with_kernels
    kernel = root / "csrc/aten/ops/topk_values.cpp"
    kernel.write_text(kernel.read_text() + "\n// tuned by hand\n")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".backendgen.lock"}
    out = run_cli("remove-op", "topk", "--project", str(root))
    assert out.returncode == 2 and "csrc/aten/ops/topk_values.cpp changed since add-op wrote it" in out.stderr
    assert "--force" in out.stderr and "Traceback" not in out.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".backendgen.lock"} == before
    res = api.remove_ops(["aten::topk.values"], root, force=True)
    assert not kernel.exists() and [b.name for b in res.backups if b.parent == kernel.parent] != []
    backup = next(b for b in res.backups if b.parent == kernel.parent)
    assert backup.read_text().endswith("// tuned by hand\n") and not backup.name.endswith(".cpp")


def test_remove_op_refuses_template_and_unknown_operators(with_kernels):
    root = with_kernels
    with pytest.raises(ProjectError, match="aten::empty_strided is part of the template"):
        api.remove_ops(["empty_strided"], root)
    with pytest.raises(ProjectError, match="'sin' has no kernel in this project.*aten::abs.out"):
        api.remove_ops(["sin"], root)
    assert "aten::abs.out" in _ops(root) and (root / "csrc/aten/ops/abs.cpp").exists()


def _edit_metadata(root, fn):
    path = root / "backendgen.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2))


def test_accept_refuses_while_check_has_errors(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)  # not built: an error
    before = (root / "backendgen.json").read_text()
    out = run_cli("check", "--accept", "--project", str(root))
    assert out.returncode == 1 and "not accepted: fix the errors above first" in out.stdout
    assert (root / "backendgen.json").read_text() == before


def test_accept_records_the_installed_torch_and_renamed_arguments(project_copy):
    root = project_copy

    def as_if_from_an_older_torch(data):
        data["torch"] = {"version": "2.12.9", "native_functions_sha256": "0" * 64}
        add = next(d for d in data["ops"] if d["op"] == "aten::add.out")
        add["schema"] = add["schema"].replace("Tensor other", "Tensor other_tensor")  # a rename: same C++ types
        add["signature"] = add["signature"].replace("& other", "& other_tensor")

    _edit_metadata(root, as_if_from_an_older_torch)
    with pytest.raises(ProjectError, match="generated for torch 2.12.9"):
        api.add_ops(["abs.out"], root, dry_run=True)
    report = api.check(root, accept=True)
    assert report.exit_code == 0 and report.accepted is not None
    assert report.accepted["updated_ops"] == ["aten::add.out"] and report.accepted["from"] == "2.12.9"
    project = Project.load(root)
    assert project.torch_version == report.accepted["to"]
    assert "Tensor other," in project.find_op("aten::add.out").schema
    # the next check has nothing to say: no version warning, no schema warning
    again = api.check(root)
    assert [f for f in again.findings if f.area in ("versions", "schema") and f.severity != "ok"] == []
    assert again.exit_code == 0
    assert api.add_ops(["abs.out"], root, dry_run=True).added == ["aten::abs.out"]
    out = run_cli("check", "--accept", "--project", str(root))
    assert out.returncode == 0 and "nothing to accept" in out.stdout
