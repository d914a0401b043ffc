"""A bad environment gets one clear line saying what to do (issue #5)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_only, run_cli, unique_device

from backendgen import api
from backendgen.plumbing.errors import EnvironmentProblem
from backendgen.toolchain import build
from backendgen.torchdb import opdb, support


def test_torch_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(
        EnvironmentProblem, match=rf"torch is not installed.*pip install torch=={re.escape(support.TESTED[0])}"
    ):
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
    (info / "METADATA").write_text(
        real.read_text("METADATA").replace(f"Version: {real.version}", f"Version: {version}", 1)
    )
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
    out = run_cli(
        "new", unique_device("new"), "-o", str(dest), "--no-build", env=_torch_reporting_version(tmp_path, version)
    )
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
    assert {f["subject"] for f in findings if f["severity"] == "error"} == {
        json.loads((dest / "backendgen.json").read_text())["package"]
    }  # "not built", nothing about the version


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


@pytest.mark.parametrize("tool", build.TEST_TOOLS)
def test_a_missing_test_tool_is_named_not_reported_as_failing_tests(monkeypatch, rendered_project, tmp_path, tool):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tool else real(name, *a))
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    with pytest.raises(EnvironmentProblem, match=rf"^{tool} is not installed in this Python .*; pip install {tool}$"):
        build.run_tests(root)
    assert not (root / "build").exists()  # pytest never ran
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".backendgen.lock"}
    with pytest.raises(EnvironmentProblem, match=f"^{tool} is not installed"):
        api.add_ops(["abs.out"], root)  # refused before writing or compiling anything
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".backendgen.lock"} == before


def test_a_missing_test_tool_is_one_line_from_the_cli(rendered_project, tmp_path):
    """The real command, in a Python where pytest cannot be found."""
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    script = (
        "import importlib.util as u, sys; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'pytest' else real(name, *a)\n"
        "from backendgen.cli.app import main; sys.argv = ['backendgen', 'add-op', 'abs.out']; main()"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: pytest is not installed") and line.endswith("pip install pytest")
    assert "Traceback" not in out.stderr and "tests failed" not in out.stderr
    assert not (root / "csrc/aten/ops/abs.cpp").exists()


def test_a_plain_install_has_what_the_generated_tests_import(rendered_project):
    """backendgen's own requirements (no extra) and the generated project's `test` extra, which its
    README and CI install, both name every tool the generated tests import besides torch."""
    import importlib.metadata

    import tomllib
    from packaging.requirements import Requirement

    plain = {Requirement(r).name for r in importlib.metadata.requires("backendgen") if "extra" not in r}
    assert set(build.TEST_TOOLS) <= plain
    extra = tomllib.loads((rendered_project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(build.TEST_TOOLS) <= {Requirement(r).name for r in extra}
    command = 'pip install --no-build-isolation -e ".[test]"'
    assert command in (rendered_project / "README.md").read_text()
    assert command in (rendered_project / ".github/workflows/ci.yml").read_text()


@pytest.fixture
def tiny_install(tmp_path):
    """A real editable install (pip's own files) of a tiny package with the dist name a device's
    project would have: no extension, no entry point. Yields (device, dist name, its directory)."""
    from backendgen.project import naming

    device = unique_device("inst")
    dist = naming.derive(device, None).dist_name
    src = tmp_path / "elsewhere"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=70"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{dist}"\nversion = "0.1.0"\n[tool.setuptools]\npy-modules = []\n'
    )
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(src)], check=True, capture_output=True
    )
    yield device, dist, src
    subprocess.run([*pip, "uninstall", "-y", "-q", dist], capture_output=True)


def _installed(dist: str) -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "show", "-q", dist], capture_output=True).returncode == 0


def test_an_install_whose_directory_is_gone_is_replaced(tiny_install, tmp_path):
    """After a failed `new` the user deletes the project and runs `new` again: the editable install
    left behind points at nothing, so `new` removes it and says so."""
    device, dist, src = tiny_install
    shutil.rmtree(src)
    out = run_cli("new", device, "-o", str(tmp_path / "again"), "--no-build")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"note: uninstalled {dist}: it was installed (editable) from {src}, which no longer exists" in out.stdout
    assert not _installed(dist)
    assert (tmp_path / "again" / "backendgen.json").is_file()


def test_an_install_from_another_directory_that_exists_is_refused(tiny_install, tmp_path):
    device, dist, src = tiny_install
    out = run_cli("new", device, "-o", str(tmp_path / "other"), "--no-build")
    assert out.returncode == 2
    assert f"error: {dist} is already installed in this environment (from {src}); pip uninstall {dist}" in out.stderr
    assert _installed(dist) and not (tmp_path / "other").exists()


def test_project_for_another_torch(rendered_project, tmp_path):
    import json

    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    meta = json.loads((root / "backendgen.json").read_text())
    meta["torch"]["version"] = "2.12.0+cpu"
    (root / "backendgen.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="generated for torch 2.12.0.*run backendgen check"):
        api.add_ops(["abs.out"], root, build_it=False)


def _processes_under(pid: int) -> list[str]:
    """The command names (/proc/PID/comm) of every process descended from `pid`."""
    children: dict[int, list[tuple[int, str]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # it ended meanwhile
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append((int(stat.parent.name), comm))
    names, todo = [], [pid]
    while todo:
        for child, comm in children.get(todo.pop(), []):
            names.append(comm)
            todo.append(child)
    return names


def _wait_for_a_compiler_under(proc: subprocess.Popen, deadline_s: float = 600) -> None:
    """Wait until the C++ compiler proper (cc1plus) runs under `proc`: the event the interrupt is
    meant for. Fail, saying so, if `proc` ends first or the deadline passes (a machine so busy that
    no compile started in `deadline_s`)."""
    deadline = time.monotonic() + deadline_s
    while "cc1plus" not in _processes_under(proc.pid):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"add-op ended (exit {proc.returncode}) before a compiler was seen running under it, so "
                f"there was no build to interrupt:\n{out}{err}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"no compiler started under add-op within {deadline_s:.0f} s")
        time.sleep(0.05)


def test_ctrl_c_during_the_build_leaves_the_project_as_it_was(rendered_project, tmp_path):
    """SIGINT while add-op compiles: exit 130 and every file as before (nothing was installed yet)."""
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)

    def files():
        return {
            p: p.read_bytes()
            for p in root.rglob("*")
            if p.is_file()
            and "build" not in p.relative_to(root).parts
            and p.name != ".backendgen.lock"
            and "egg-info" not in str(p)
        }

    before = files()
    # without ccache, so that the compiler really runs (a cache hit could finish the build at once)
    proc = subprocess.Popen(
        [sys.executable, "-m", "backendgen", "add-op", "abs.out", "--project", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, BACKENDGEN_NO_CCACHE="1"),
        start_new_session=True,
        # as in a terminal: a test run started in the background of a script (`pytest &`) ignores
        # SIGINT, and a child inherits that; Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for_a_compiler_under(proc)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: every process of the command gets it
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 130:  # a build that went through installed the copy: the session's tests need theirs
        dist = json.loads((root / "backendgen.json").read_text())["dist_name"]
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", dist], capture_output=True)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    assert files() == before
    # and it works when run again (without building, to keep the test fast)
    assert api.add_ops(["abs.out"], root, build_it=False).added == ["aten::abs.out"]


def test_keep_on_failure_keeps_the_new_files_and_says_where(rendered_project, tmp_path, monkeypatch):
    from backendgen.plumbing.errors import BuildError

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
    site_dir = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    outer = sysconfig.get_paths()["purelib"]
    (site_dir / "outer.pth").write_text(f"import site; site.addsitedir({outer!r})\n")
    with read_only(site_dir):
        yield python, site_dir


def test_read_only_site_packages_is_refused_before_anything_is_written(read_only_python, tmp_path):
    python, site_dir = read_only_python
    dest = tmp_path / "proj"
    out = subprocess.run(
        [str(python), "-m", "backendgen", "new", unique_device(), "-o", str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{site_dir} is not writable" in out.stderr and "virtualenv" in out.stderr
    assert "Traceback" not in out.stderr and not dest.exists()


def test_subprocess_env_sets_or_removes_autoload_and_prepends_to_pythonpath(monkeypatch, tmp_path):
    from backendgen.plumbing.environment import subprocess_env

    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert subprocess_env()["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in subprocess_env(autoload=None)
    assert subprocess_env(pythonpath=tmp_path)["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert subprocess_env(pythonpath=tmp_path)["PYTHONPATH"] == str(tmp_path)
