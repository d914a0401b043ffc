"""A bad environment gets one clear line saying what to do (issue #5)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backendgen import api, build, opdb, support
from backendgen.errors import EnvironmentProblem
from conftest import read_only, run_cli, unique_device


def test_torch_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(EnvironmentProblem, match=r"torch is not installed.*pip install torch==2.13.0"):
        opdb.torch_info()


def test_torch_without_torchgen(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchgen" else real(name, *a))
    with pytest.raises(EnvironmentProblem, match="ships no torchgen"):
        opdb.torch_info()


def _torch_reporting_version(tmp_path: Path, version: str) -> dict:
    """The environment of a `backendgen` process in which the installed torch reports `version`:
    a torch dist-info with that version comes first on the path (the torch it runs is the real one)."""
    import importlib.metadata
    import os

    real = importlib.metadata.distribution("torch")
    meta = tmp_path / "fake-meta"
    info = meta / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(real.read_text("METADATA").replace(
        f"Version: {real.version}", f"Version: {version}", 1))
    return {"PYTHONPATH": os.pathsep.join([str(meta), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


@pytest.mark.parametrize("version", ["2.12.1", "2.12.1+cu128", "1.13.0"])
def test_a_torch_older_than_the_minimum_is_refused(version, tmp_path):
    dest = tmp_path / "proj"
    out = run_cli("new", unique_device("old"), "-o", str(dest), env=_torch_reporting_version(tmp_path, version))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"torch {version} is older than {support.MINIMUM}" in lines[0], out.stderr
    assert f"pip install torch=={support.TESTED[-1]}" in lines[0]
    assert "Traceback" not in out.stderr and not dest.exists()


@pytest.mark.parametrize("version", ["2.99.0", "2.13.7+cpu", "3.0.0.dev20300101"])
def test_a_newer_untested_torch_proceeds_with_one_note(version, tmp_path):
    dest = tmp_path / "proj"
    out = run_cli("new", unique_device("new"), "-o", str(dest), "--no-build", env=_torch_reporting_version(tmp_path, version))
    assert out.returncode == 0, out.stdout + out.stderr
    notes = [ln for ln in out.stdout.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1, out.stdout
    assert f"torch {version} has not been tested" in notes[0] and ", ".join(support.TESTED) in notes[0]
    assert json.loads((dest / "backendgen.json").read_text())["torch"]["version"] == version
    # check says the same, as information (the project is not built: that is its error)
    out = run_cli("check", "--json", "--project", str(dest), env=_torch_reporting_version(tmp_path / "c", version))
    findings = json.loads(out.stdout)["findings"]
    untested = [f for f in findings if f["area"] == "versions" and f["detail"].get("kind") == "untested"]
    assert len(untested) == 1 and untested[0]["severity"] == "info", findings
    assert {f["subject"] for f in findings if f["severity"] == "error"} == {json.loads(
        (dest / "backendgen.json").read_text())["package"]}  # "not built", nothing about the version


def test_each_tested_release_is_tested_and_its_build_tag_does_not_matter():
    for version in support.TESTED:
        assert support.torch_support(version).tested and support.torch_support(version).note is None
        assert support.torch_support(version + "+cu130").tested
    assert support.release(support.MINIMUM) <= min(map(support.release, support.TESTED))


def test_no_ninja(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/" + name)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no ninja beside it either
    with pytest.raises(EnvironmentProblem, match="ninja is not installed; pip install ninja"):
        build.check_toolchain()


def test_project_for_another_torch(rendered_project, tmp_path):
    import json

    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    meta = json.loads((root / "backendgen.json").read_text())
    meta["torch"]["version"] = "2.12.0+cpu"
    (root / "backendgen.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="generated for torch 2.12.0.*run backendgen check"):
        api.add_ops(["abs.out"], root, build_it=False)


def test_ctrl_c_during_the_build_leaves_the_project_as_it_was(rendered_project, tmp_path):
    """SIGINT while add-op compiles: exit 130 and every file as before (nothing was installed yet)."""
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)

    def files():
        return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "build" not in p.relative_to(root).parts
                and p.name != ".backendgen.lock" and "egg-info" not in str(p)}

    before = files()
    proc = subprocess.Popen([sys.executable, "-m", "backendgen", "add-op", "abs.out", "--project", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (root / "build" / "backendgen-build.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    assert files() == before
    # and it works when run again (without building, to keep the test fast)
    assert api.add_ops(["abs.out"], root, build_it=False).added == ["aten::abs.out"]


def test_keep_on_failure_keeps_the_new_files_and_says_where(rendered_project, tmp_path, monkeypatch):
    from backendgen.errors import BuildError

    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    monkeypatch.setenv("CXX", "false")  # a compiler that fails every compile
    with pytest.raises(BuildError) as info:
        api.add_ops(["abs.out"], root, keep_on_failure=True)
    assert (root / "csrc/aten/ops/abs.cpp").is_file()
    assert "csrc/aten/ops/abs.cpp" in info.value.hint and "kept" in info.value.hint
    assert "(full log:" in str(info.value)


def test_another_installed_backend_is_reported_before_anything_is_written(built_project, tmp_path):
    """The session's backend is installed; a second one could not load beside it."""
    dest = tmp_path / "second"
    with pytest.raises(EnvironmentProblem, match="another PrivateUse1 backend .* is installed"):
        api.new_backend(unique_device("two"), dest)
    assert not dest.exists()


def test_building_a_second_backend_is_refused_while_another_is_installed(built_project, rendered_project, tmp_path):
    """`backendgen build` of a project never installed would install a second PrivateUse1 backend."""
    root = tmp_path / "second"
    shutil.copytree(rendered_project, root)
    with pytest.raises(EnvironmentProblem, match="another PrivateUse1 backend .* is installed"):
        api.build_backend(root)
    assert not list(root.glob("*/_C*.so")) and not (root / "build" / "backendgen-build.log").exists()


@pytest.fixture
def read_only_python(tmp_path):
    """A virtualenv whose site-packages cannot be written, seeing this environment's packages.
    Yields the interpreter and that directory."""
    import sysconfig

    venv = tmp_path / "ro-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site_dir = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    outer = sysconfig.get_paths()["purelib"]
    (site_dir / "outer.pth").write_text(f"import site; site.addsitedir({outer!r})\n")
    with read_only(site_dir):
        yield python, site_dir


def test_read_only_site_packages_is_refused_before_anything_is_written(read_only_python, tmp_path):
    python, site_dir = read_only_python
    dest = tmp_path / "proj"
    out = subprocess.run([str(python), "-m", "backendgen", "new", unique_device(), "-o", str(dest)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{site_dir} is not writable" in out.stderr and "virtualenv" in out.stderr
    assert "Traceback" not in out.stderr and not dest.exists()
