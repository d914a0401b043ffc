"""Shared fixtures. Building a backend costs tens of seconds, so one is built per session
(`built_project`) and copied where a test must change it (`project_copy`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch_venvs import TIMELINE, TorchVenvs, scenarios_needed, versions_needed

from backendgen import api
from backendgen.toolchain import build

# The session installs a generated backend (editable) into this environment. This process started
# before that install, so its import system cannot find the package that torch's autoload entry
# point names: keep autoload off here. Tests that need it run a fresh interpreter without this.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"


def unique_device(prefix: str = "dev") -> str:
    """A device name no test hard-codes: each session builds a backend nobody has seen."""
    letters = uuid.uuid4().hex[:8].translate(str.maketrans("0123456789", "ghijklmnop"))
    return f"{prefix}{letters}"  # torch.device() accepts no digits in a device type


@contextmanager
def read_only(directory: Path):
    """Make `directory` unwritable for the duration. Permissions do not stop root, so as root it is
    bind-mounted read-only over itself (the test is skipped where mounting is not allowed)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True).returncode == 0
    if (
        not mounted
        or subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], capture_output=True).returncode != 0
    ):
        if mounted:
            subprocess.run(["umount", str(directory)], capture_output=True)
        pytest.skip("cannot bind-mount a directory read-only here (needed as root)")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], capture_output=True)


@pytest.fixture(scope="session", autouse=True)
def torch_venvs(request, tmp_path_factory):
    """The virtualenvs of the selected tests' `torch_venv` marks (tests/test_torch_matrix.py), made in
    the background from the session's start, so that their installs overlap the builds, and the
    scenarios those marks name, run in the background as the venvs are made (tests/torch_venvs.py);
    nothing when no selected test is marked."""
    items = request.session.items
    venvs = TorchVenvs(tmp_path_factory.mktemp("torch-venvs"), versions_needed(items), scenarios_needed(items))
    yield venvs
    venvs.close()


@pytest.fixture(scope="session")
def rendered_project(tmp_path_factory) -> Path:
    """A freshly generated project, not built. Copy before modifying."""
    root = tmp_path_factory.mktemp("rendered") / "project"
    api.new_backend(unique_device("ren"), root, build_it=False)
    return root


@pytest.fixture(scope="session")
def built_project(tmp_path_factory) -> Path:
    """A generated project, built and installed (editable) once per session. Copy before modifying."""
    root = tmp_path_factory.mktemp("built") / "project"
    res = api.new_backend(unique_device("eze"), root, build_it=True, test_it=False)
    yield root
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-y", "-q", res.names.dist_name],
        check=False,
        capture_output=True,
    )


@pytest.fixture
def installed(built_project) -> Path:
    """The session's project, as what `import torch` loads: other tests install copies of it (same
    device name, other operators), so it is reinstalled when it is not the one installed."""
    return ensure_installed(built_project)


@pytest.fixture(scope="session")
def opt_in_run(built_project):
    """`backendgen test --opinfo --dtype float32 --dtype int64 --compile --distributed --models` on the
    session's backend, run once, as a user runs every suite at once: the conformance suite, the quick
    suite, then each opt-in suite (one run of the quick suite where `test --opinfo` and `test --compile
    ...` would run it twice): (the CLI's completed process, {suite: its log}, the conformance report,
    read right after the run). They take minutes together;
    tests/test_conformance.py, test_compile.py, test_distributed.py, test_models.py and test_e2e.py
    read their parts."""
    out = run_cli("test", *CONFORMANCE_ARGS, "--compile", "--distributed", "--models", "--project", str(built_project))
    logs = {}
    for name in ("test", "compile", "distributed", "models"):
        log = built_project / "build" / f"backendgen-{name}.log"
        logs[name] = log.read_text() if log.exists() else "(no log)"
    report = built_project / "build" / "backendgen-conformance.json"
    return out, logs, json.loads(report.read_text()) if report.exists() else None


CONFORMANCE_ARGS = ("--opinfo", "--dtype", "float32", "--dtype", "int64")  # float32 and one integer dtype


@dataclass
class Documented:
    """A copy of the session's project after the docs' commands that change a project."""

    root: Path
    runs: list  # (command, its completed process), in the docs' order, up to the first that failed
    fallbacks_after: subprocess.CompletedProcess  # `abs` on the device right after the commands, in a new interpreter


@pytest.fixture(scope="session")
def documented_project(built_project, tmp_path_factory) -> Documented:
    """The commands of the docs that change a project (tests/test_docs.py's IN_COPY: add-op of ATen
    operators, of an operator of the backend's own and of an autograd override, an autocast policy,
    the rebuilds, check --accept, ...) run once, in order, in one copy of the session's project, as
    a user runs them; test_docs asserts that each succeeded, test_custom_ops reads the operators
    they added (rather than adding and building them again)."""
    from test_docs import IN_COPY, documented_env, run_documented

    root = tmp_path_factory.mktemp("documented") / "project"
    shutil.copytree(built_project, root, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    meta = json.loads((root / "backendgen.json").read_text())
    runs = []
    for entry in IN_COPY:
        command = entry if isinstance(entry, str) else entry[1]
        ran = run_documented(command, root, timeout=1200)
        runs.append((command, ran))
        if ran.returncode != 0:
            break
    probe = (
        "import torch, sys; d = sys.argv[1]; m = getattr(torch, d); m.reset_fallback_counts();"
        " torch.ones(3, device=d).neg().abs(); print(m.fallback_counts())"
    )
    after = subprocess.run(
        [sys.executable, "-c", probe, meta["device"]],
        env=documented_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return Documented(root, runs, after)


def ensure_installed(root: Path) -> Path:
    """`root` as what `import torch` loads (tests install copies under the session's device name)."""
    if not build.installed_from(root, json.loads((root / "backendgen.json").read_text())["dist_name"]):
        api.build_backend(root)
    return root


@pytest.fixture
def project_copy(built_project, tmp_path) -> Path:
    """A copy of the built project (its build/ directory left out: ninja's files hold absolute paths)."""
    dest = tmp_path / "copy"
    shutil.copytree(built_project, dest, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    return dest


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `backendgen` command as a user would."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "backendgen", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def patch_integration_point(monkeypatch, name: str, change) -> None:
    """Make `backendgen.project.manifest.load()` return the template's manifest with integration point
    `name` changed: `change(point)` returns the fields to replace (e.g. an API no torch has)."""
    import dataclasses

    from backendgen.project import manifest

    real = manifest.load()
    points = tuple(dataclasses.replace(p, **change(p)) if p.name == name else p for p in real.integration_points)
    assert points != real.integration_points, f"no integration point {name!r}"
    monkeypatch.setattr(manifest, "load", lambda: dataclasses.replace(real, integration_points=points))


# ---- where the CPU goes ---------------------------------------------------------------------------
# `.ci/run`'s time is bounded by CPU, not by waiting: its budget is met by doing less work, so the
# session ends with the machine's CPU seconds per test (the whole machine's /proc/stat between the
# test's start and end, fixtures it set up included): `user`+`system` is the session's own work and
# whatever it started, `nice` is the background matrix (tests/torch_venvs.py runs it under nice), `idle`
# what no one used. Noisy where other programs share the machine; read it to choose what to cut.

_CPU_FIELDS = ("user", "nice", "system", "idle")
_cpu_by_test: list[tuple[str, dict[str, float]]] = []
_cpu_start: dict[str, float] | None = None


def _cpu_now() -> dict[str, float] | None:
    try:
        with open("/proc/stat") as fh:
            values = fh.readline().split()[1:5]
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return {name: int(v) / ticks for name, v in zip(_CPU_FIELDS, values, strict=True)}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _cpu_start
    before = _cpu_now()
    _cpu_start = _cpu_start or before
    yield
    after = _cpu_now()
    if before and after:
        _cpu_by_test.append((item.nodeid, {k: after[k] - before[k] for k in _CPU_FIELDS}))


def pytest_terminal_summary(terminalreporter):
    end = _cpu_now()
    if not _cpu_by_test or not _cpu_start or not end:
        return
    total = {k: end[k] - _cpu_start[k] for k in _CPU_FIELDS}
    tr = terminalreporter
    tr.section("CPU seconds by test (the whole machine's, during the test)")
    tr.write_line("session: " + ", ".join(f"{k} {v:.0f} s" for k, v in total.items()) + f" on {os.cpu_count()} CPUs")
    ranked = sorted(_cpu_by_test, key=lambda t: -(t[1]["user"] + t[1]["system"]))
    for nodeid, cpu in ranked[:40]:
        tr.write_line(f"{cpu['user'] + cpu['system']:8.1f} user+system {cpu['nice']:7.1f} nice  {nodeid}")
    if TIMELINE:
        tr.section("the background (tests/torch_venvs.py), in seconds from the session's start")
        for start, end, what in sorted(TIMELINE):
            tr.write_line(f"{start:7.0f} {end:7.0f} {end - start:6.0f} s  {what}")


def pytest_collection_modifyitems(session, config, items):
    """The torch matrix's tests (marked torch_venv) last: their work runs in the background from the
    session's start, on the CPU the other tests leave idle; a matrix test in the middle of the session
    would stop everything after it until the background is done."""
    items[:] = [i for i in items if not i.get_closest_marker("torch_venv")] + [
        i for i in items if i.get_closest_marker("torch_venv")
    ]
