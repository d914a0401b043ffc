"""The metadata file, the lock and transactional edits."""

import json
import shutil

import pytest

from backendgen.plumbing.errors import LockedError, ProjectError
from backendgen.project import history, manifest
from backendgen.project.on_disk import METADATA_FILE, Project, Transaction
from backendgen.project.record import Record, TorchTarget


def test_rendered_project_metadata_records_everything(rendered_project):
    data = json.loads((rendered_project / METADATA_FILE).read_text())
    import torch

    assert data["torch"]["version"] == torch.__version__
    assert len(data["torch"]["native_functions_sha256"]) == 64
    ops = {d["op"]: d for d in data["ops"]}
    assert "aten::empty_strided" in ops and ops["aten::empty_strided"]["origin"] == "template"
    assert ops["aten::mul.out"]["source"] == "csrc/aten/ops/mul.cpp"
    assert "aten::mul.Tensor" in ops["aten::mul.out"]["covers"]
    for d in data["ops"]:
        schema = torch._C.parse_schema(d["schema"])
        assert schema.name == d["op"].split(".")[0]


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "not a backendgen project"),
        ("{truncated", "corrupted"),
        ('{"format": 1}', "missing"),
        ('{"format": 99, "device": "x", "package": "p", "dist_name": "d", "torch": {}, "ops": []}', "format 99"),
        (
            '{"format": 1, "device": "x", "package": "p", "dist_name": "d", "torch": {"version": "2.13.0"}, '
            '"ops": [1]}',
            "ops.0. is malformed",
        ),
    ],
)
def test_missing_or_corrupted_metadata_is_a_clear_error(tmp_path, content, match):
    if content is not None:
        (tmp_path / METADATA_FILE).write_text(content)
    with pytest.raises(ProjectError, match=match):
        Project.load(tmp_path)


def test_find_walks_up_from_a_subdirectory(rendered_project):
    assert Project.find(rendered_project / "csrc" / "aten").root == rendered_project.resolve()


def test_outside_a_project(tmp_path):
    with pytest.raises(ProjectError, match="not inside a backendgen project"):
        Project.find(tmp_path)


def test_lock_refuses_a_second_command(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    project = Project.load(root)
    with project.lock():
        with pytest.raises(LockedError, match="another backendgen command"):
            with Project.load(root).lock():
                pass
    with project.lock():  # released
        pass


def test_transaction_restores_files_and_removes_new_ones(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("original")
    with pytest.raises(RuntimeError):
        with Transaction(tmp_path) as tx:
            tx.write(keep, "changed")
            tx.write(tmp_path / "new" / "dir" / "file.txt", "new")
            raise RuntimeError("build failed")
    assert keep.read_text() == "original"
    assert not (tmp_path / "new").exists()


def test_transaction_rolls_back_on_ctrl_c(tmp_path):
    f = tmp_path / "f"
    f.write_text("a")
    with pytest.raises(KeyboardInterrupt):
        with Transaction(tmp_path) as tx:
            tx.write(f, "b")
            raise KeyboardInterrupt
    assert f.read_text() == "a"


def test_a_project_is_read_with_the_paths_of_its_own_template_version(monkeypatch, tmp_path):
    """Project.paths come from the manifest of the project's template version (its stored state), not the
    installed one; a key an older manifest lacks, or a manifest without "paths", gives the current place."""
    current = manifest.load()
    stored = {8: {"paths": {"registration": "csrc/old/registration.cpp"}}, 5: {"template_version": 5}}
    blobs = {f"sha-{v}": json.dumps(m).encode() for v, m in stored.items()}

    class FakeState:
        def __init__(self, v):
            self.files = ((manifest.MANIFEST_FILE, f"sha-{v}"),)

    monkeypatch.setattr(history, "states", lambda version=None: [FakeState(version)] if version in stored else [])
    monkeypatch.setattr(history, "blob", blobs.__getitem__)
    history.paths_of.cache_clear()
    try:

        def project(version):
            record = Record(
                device="x",
                package="torch_x",
                dist_name="torch-x",
                torch=TorchTarget(version="2.9.1"),
                template_version=str(version),
            )
            return Project(tmp_path, record)

        assert project(8).registration_file == "csrc/old/registration.cpp"
        assert project(8).paths["model_tests"] == current.path("model_tests")
        assert project(5).paths == current.paths
        assert project(current.template_version).registration_file == current.path("registration")
        assert project(8).paths is project(8).paths  # read once per version
    finally:
        history.paths_of.cache_clear()
