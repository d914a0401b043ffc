"""Faults a user meets: signals at fixed phases, kills and reruns, read-only and full file systems,
hand-edited metadata, encodings (docs/guarantees.md, "Faults").

Signals are delivered at named phases through the test hook (backendgen/plumbing/faults.py:
BACKENDGEN_FAULT=PHASE=ACTION), never after a sleep. Projects are copies of the session's
(tests/conftest.py); one test builds (the rerun after a SIGKILL), every other one stops before a
compiler runs or needs no build."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_only, run_cli

from backendgen import api
from backendgen.plumbing.errors import EnvironmentProblem, UserError


def _files(root: Path) -> dict[str, bytes]:
    """Every file of the project a user owns (not build output, the lock or pip's metadata)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and "build" not in p.relative_to(root).parts
        and p.name != ".backendgen.lock"
        and "egg-info" not in str(p)
        and "__pycache__" not in p.parts
    }


def _processes_in(root: Path) -> list[str]:
    """Processes whose working directory is inside `root` (a compiler or pip left running)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            where = Path(os.readlink(cwd))
        except OSError:
            continue
        if where == root or root in where.parents:
            found.append(cwd.parent.name)
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fault_env(tmp_path: Path, spec: str | None) -> tuple[dict, Path]:
    log = tmp_path / "faults.log"
    env = {"BACKENDGEN_FAULT_LOG": str(log), "BACKENDGEN_NO_CCACHE": "1"}
    if spec:
        env["BACKENDGEN_FAULT"] = spec
    return env, log


def _phases(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    return [(ln.split()[0], int(ln.split()[1])) for ln in log.read_text().splitlines() if ln.strip()]


@pytest.fixture
def rendered_copy(rendered_project, tmp_path) -> Path:
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    return root


@pytest.fixture
def built_copy(built_project, tmp_path) -> Path:
    """A copy of the built project with the record of what its last build saw (build/ is left
    out otherwise: ninja's files hold absolute paths)."""
    root = tmp_path / "copy"
    shutil.copytree(built_project, root, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    (root / "build").mkdir()
    shutil.copy2(built_project / "build" / "backendgen-built.json", root / "build" / "backendgen-built.json")
    return root


# --- signals -----------------------------------------------------------------------------------


def test_a_signal_during_the_build_rolls_back_and_stops_the_build(rendered_copy, tmp_path):
    """SIGTERM (kill, timeout, a cancelled CI job) while add-op's build runs: one line, exit 128+N,
    every file as before, and no process of the build left."""
    sig = "SIGTERM"
    root = rendered_copy
    before = _files(root)
    env, log = _fault_env(tmp_path, f"build:child={sig}")
    out = run_cli("add-op", "abs.out", "--project", str(root), env=env)
    signum = signal.Signals[sig]
    assert out.returncode == 128 + signum, out.stdout + out.stderr
    assert f"interrupted by {sig}; rolled back" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert _files(root) == before
    children = [pid for phase, pid in _phases(log) if phase == "child"]
    assert children, _phases(log)  # the build had started a program
    assert not any(_group_alive(pid) for pid in children)
    assert _processes_in(root) == []


def test_a_signal_from_outside_while_add_op_waits_rolls_back(rendered_copy, tmp_path):
    """SIGHUP (a closed terminal) from another process (the command waits at a phase until it comes)."""
    root = rendered_copy
    before = _files(root)
    env, log = _fault_env(tmp_path, "add-op:written=wait")
    proc = subprocess.Popen(
        [sys.executable, "-m", "backendgen", "add-op", "abs.out", "--no-build", "--project", str(root)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's SIGHUP: a session started under nohup ignores it, a child inherits that, and
        # backendgen then keeps it ignored (as nohup asks): the test wants a terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while ("add-op:written", proc.pid) not in _phases(log):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "add-op never reached the phase"
        time.sleep(0.05)
    assert (root / "csrc/aten/ops/abs.cpp").exists()  # written, as the phase says
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, out + err
    assert "interrupted by SIGHUP" in err
    assert _files(root) == before


def test_new_interrupted_during_its_build_leaves_nothing_and_can_be_run_again(tmp_path, monkeypatch):
    """In-process, with the CLI's handlers installed (the session's backend is installed, so the
    CLI's `new` would refuse to build a second one before reaching the build)."""
    from conftest import unique_device

    from backendgen.commands import new
    from backendgen.plumbing import interrupt

    monkeypatch.setattr(new, "check_no_other_backend", lambda dist_name: None)
    monkeypatch.setenv("BACKENDGEN_FAULT", "new:rendered=SIGTERM")
    dest = tmp_path / "proj"
    device = unique_device("flt")
    saved = {sig: signal.getsignal(sig) for sig in interrupt.SIGNALS}
    interrupt.install()
    try:
        with pytest.raises(interrupt.Interrupted) as info:
            api.new_backend(device, dest, build_it=True, test_it=False)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert interrupt.exit_code(info.value) == 128 + signal.SIGTERM
    assert not dest.exists()
    monkeypatch.delenv("BACKENDGEN_FAULT")
    assert api.new_backend(device, dest, build_it=False).root == dest  # the retry is not blocked


# --- kills and reruns --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_and_rerun(built_project, tmp_path_factory):
    """add-op killed (SIGKILL) after it recorded its operator, before the build; then the same
    add-op again. The one build of this file: (the project, the rerun's completed process)."""
    root = tmp_path_factory.mktemp("killed") / "copy"
    shutil.copytree(built_project, root, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    (root / "build").mkdir()
    shutil.copy2(built_project / "build" / "backendgen-built.json", root / "build" / "backendgen-built.json")
    log = tmp_path_factory.mktemp("killed-log") / "faults.log"
    out = run_cli(
        "add-op",
        "abs.out",
        "--project",
        str(root),
        env={"BACKENDGEN_FAULT": "add-op:written=SIGKILL", "BACKENDGEN_FAULT_LOG": str(log)},
    )
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    assert "aten::abs.out" in (root / "backendgen.json").read_text()
    return root, run_cli("add-op", "abs.out", "--no-test", "--project", str(root))


def test_a_kill_between_recording_and_building_is_finished_by_the_rerun(killed_and_rerun):
    """The record and the library disagreed; the same add-op again builds it (it answered
    "already native, nothing to do" before), and check then finds the kernel in the library."""
    root, out = killed_and_rerun
    assert out.returncode == 0, out.stdout + out.stderr
    assert "not built with it since" in out.stdout and "aten::abs.out: built" in out.stdout
    assert "aten::abs.out" in json.loads((root / "build" / "backendgen-built.json").read_text())["entries"]
    report = api.check(root)
    about_abs = [f for f in report.findings if f.subject == "aten::abs.out" and f.severity.value == "error"]
    assert about_abs == [] and report.exit_code == 0, [
        (f.subject, f.message) for f in report.findings if f.severity.value == "error"
    ]


def test_a_full_disk_while_the_library_is_installed_is_one_line(killed_and_rerun, tmp_path):
    """The build's last step copies the library into the package; with no space left there: one
    line, exit 2, and the package keeps the library it had."""
    from backendgen.toolchain import build

    root, _ = killed_and_rerun
    package = json.loads((root / "backendgen.json").read_text())["package"]
    # the next build takes the fast path (ninja, the link, the copy), as the rerun left it installed
    assert (root / build.RECORD).exists() and build.installed_from(
        root, json.loads((root / "backendgen.json").read_text())["dist_name"]
    )
    so = build.extension_path(root, package)
    before = so.read_bytes()
    library = root / build.BuildRecord.load(root).library
    if library.exists():
        os.utime(library)  # differs from the package's copy: the copy must be made again
    pkg = root / package
    files = [p for p in pkg.rglob("*") if p.is_file()]
    room = sum(p.stat().st_size + 8192 for p in files) + (128 << 10)  # the package fits, a second library does not
    assert len(before) > 4 * (128 << 10)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(tmp_path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        shutil.copytree(pkg, tmp_path / "pkg", symlinks=True)
        if subprocess.run(["mount", "--bind", str(tmp_path / "pkg"), str(pkg)], capture_output=True).returncode:
            pytest.skip("cannot bind-mount here")
        try:
            out = run_cli("build", "--project", str(root))
        finally:
            subprocess.run(["umount", str(pkg)], capture_output=True)
    finally:
        subprocess.run(["umount", str(tmp_path)], capture_output=True)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "No space left on device" in out.stderr and "the previous build was kept" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert so.read_bytes() == before


def test_a_full_disk_during_the_link_names_where_the_build_writes(killed_and_rerun, tmp_path):
    """The linker's own words are "final link failed: No space left on device" and "ld returned 1
    exit status"; the error names the full file system, with the space left where the build writes,
    and the package keeps the library it had."""
    from backendgen.toolchain import build

    root, _ = killed_and_rerun
    package = json.loads((root / "backendgen.json").read_text())["package"]
    record = build.BuildRecord.load(root)
    assert record is not None  # the next build takes the fast path: ninja, the link, the copy
    so = build.extension_path(root, package)
    before = so.read_bytes()
    library = root / record.library
    objects = [root / a for a in record.data["link"] if a.endswith(".o")]
    os.utime(objects[0])  # newer than the library: the link runs again
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(library.parent)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        out = run_cli("build", "--project", str(root))
    finally:
        subprocess.run(["umount", str(library.parent)], capture_output=True)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "no space left on device" in line and f"{library.parent} " in line and " KB" in line, line
    assert "the previous build was kept" in line and "Traceback" not in out.stderr
    assert so.read_bytes() == before


def test_check_reports_a_record_its_files_and_library_do_not_match_and_build_names_the_file(built_copy):
    """An operator recorded after the last build (what a kill between recording and building
    leaves), and a recorded kernel file deleted by hand: check reports both; build and add-op name
    the file instead of failing inside the compiler."""
    from backendgen.commands.check import Kind

    root = built_copy
    api.add_ops(["abs.out"], root, build_it=False)
    (root / "csrc/aten/ops/mul.cpp").unlink()
    report = api.check(root)
    kinds = {(f.detail.get("kind"), f.subject) for f in report.findings if f.severity.value == "error"}
    assert {(Kind.UNBUILT, "aten::abs.out"), (Kind.MISSING_FILE, "csrc/aten/ops/mul.cpp")} <= kinds
    assert report.exit_code == 1
    for args in (["build"], ["add-op", "neg.out", "--no-build"]):
        out = run_cli(*args, "--project", str(root))
        assert out.returncode == 2, out.stdout + out.stderr
        assert "csrc/aten/ops/mul.cpp is missing" in out.stderr and "git checkout" in out.stderr


def test_a_deleted_setup_py_is_named(built_copy):
    (built_copy / "setup.py").unlink()
    out = run_cli("build", "--project", str(built_copy))
    assert out.returncode == 2 and "setup.py is missing" in out.stderr and "every build runs it" in out.stderr


# --- file systems ------------------------------------------------------------------------------


def test_a_read_only_project_is_one_line_and_unchanged(rendered_copy):
    before = _files(rendered_copy)
    with read_only(rendered_copy / "csrc" / "aten"):
        out = run_cli("add-op", "abs.out", "--no-build", "--project", str(rendered_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cannot write to" in out.stderr and "left as it was" in out.stderr and "Traceback" not in out.stderr
    assert _files(rendered_copy) == before


# --- environment -------------------------------------------------------------------------------


def test_an_empty_cxx_is_one_line(rendered_copy):
    before = _files(rendered_copy)
    out = run_cli("add-op", "abs.out", "--project", str(rendered_copy), env={"CXX": ""})
    assert out.returncode == 2 and "CXX is set but empty" in out.stderr, out.stderr
    assert _files(rendered_copy) == before


@pytest.mark.parametrize(
    "command",
    [
        ("add-op", "abs.out", "--no-build"),
        ("remove-op", "mul.Tensor"),
        ("amp", "set", "aten::add.Tensor", "fp32"),
        ("check", "--accept"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_project_from_a_newer_template_is_refused_before_anything_is_written(rendered_copy, command):
    """A project generated by a newer backendgen (its template_version above this one's): every
    command that edits it refuses, naming both versions and the upgrade, and writes nothing."""
    from backendgen import __version__
    from backendgen.project import manifest

    current = manifest.load().template_version
    meta = json.loads((rendered_copy / "backendgen.json").read_text())
    meta["template_version"] = str(current + 1)
    meta["backendgen_version"] = "9.9.0"
    (rendered_copy / "backendgen.json").write_text(json.dumps(meta, indent=2) + "\n")
    before = _files(rendered_copy)
    out = run_cli(*command, "--project", str(rendered_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = [line for line in out.stderr.splitlines() if line.strip()][:1]
    assert (
        f"template {current + 1} (backendgen 9.9.0)" in line
        and f"template {current} (backendgen {__version__})" in line
    )
    assert "upgrade backendgen" in line and "Traceback" not in out.stderr
    assert _files(rendered_copy) == before


def test_build_without_torch_is_one_line_and_keeps_the_build_record(built_copy, monkeypatch):
    from backendgen.plumbing.environment import InstalledTorch
    from backendgen.toolchain import build
    from backendgen.torchdb import opdb

    record = built_copy / build.RECORD
    record.write_text('{"format": 1}\n')
    monkeypatch.setattr(opdb, "installed_torch", lambda: InstalledTorch(None, None, None))
    with pytest.raises(EnvironmentProblem, match="torch is not installed"):
        api.build_backend(built_copy)
    assert record.read_text() == '{"format": 1}\n'


def test_an_ascii_only_terminal_gets_ascii_progress(rendered_copy):
    out = run_cli("add-op", "abs.out", "--no-build", "--project", str(rendered_copy), env={"PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok write" in out.stdout and "aten::abs.out: written" in out.stdout


# --- hand-edited metadata ----------------------------------------------------------------------


def _edit(root: Path, change) -> None:
    path = root / "backendgen.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.update(package="../../escaped"), "package"),
        (lambda d: d.update(device='x"; system("id"); //'), "device"),
        (lambda d: d.update(torch="2.13.0"), "torch"),
        (lambda d: d.update(torch={}), "torch is missing version"),
        (lambda d: d["ops"][0].update(schema=3), "ops[0]"),
        (lambda d: d.update(template_state="not-a-hash"), "template_state"),
    ],
    ids=["package-escapes", "device-injects", "torch-string", "torch-empty", "op-field-number", "template-state"],
)
def test_hand_edited_metadata_is_one_line_naming_the_field(rendered_copy, tmp_path, change, field):
    root = rendered_copy
    _edit(root, change)
    before = _files(root)
    outside = sorted(p.name for p in tmp_path.parent.iterdir())
    commands = [["add-op", "abs.out", "--no-build"]] + ([["ops", "abs"]] if field == "device" else [])
    for args in commands:
        out = run_cli(*args, "--project", str(root)) if args[0] == "add-op" else run_cli(*args, cwd=root)
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], out.stderr
        assert "internal error" not in out.stderr
    assert _files(root) == before and sorted(p.name for p in tmp_path.parent.iterdir()) == outside


def test_a_valid_template_state_is_accepted(rendered_copy):
    _edit(rendered_copy, lambda d: d.update(template_state="0" * 64))
    assert api.add_ops(["abs.out"], rendered_copy, build_it=False).added == ["aten::abs.out"]


def test_truncated_metadata_is_not_valid_json_not_outside_a_project(rendered_copy):
    path = rendered_copy / "backendgen.json"
    path.write_text(path.read_text()[:200])
    out = run_cli("ops", "abs", cwd=rendered_copy)
    assert out.returncode == 2 and "is not valid JSON" in out.stderr, out.stdout + out.stderr


# --- --schema ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, says",
    [
        ("(Tensor x, float class=1.0) -> Tensor", "keyword"),
        ("(Tensor x, float lambda) -> Tensor", "keyword"),
        ("(Tensor x, float a, float a) -> Tensor", "used twice"),
        ("(Tensor x, float a=banana) -> Tensor", "not a value of that type"),
        ("(Tensor x, float \u00e9=1.0) -> Tensor", "not an ASCII identifier"),
    ],
)
def test_a_schema_python_cannot_take_is_refused(rendered_copy, schema, says):
    device = json.loads((rendered_copy / "backendgen.json").read_text())["device"]
    before = _files(rendered_copy)
    with pytest.raises(UserError, match=says):
        api.add_ops([f"{device}::scaled"], rendered_copy, schema=schema, build_it=False)
    assert _files(rendered_copy) == before


def test_what_a_schema_writes_parses(rendered_copy):
    import ast

    device = json.loads((rendered_copy / "backendgen.json").read_text())["device"]
    res = api.add_ops(
        [f"{device}::scaled"],
        rendered_copy,
        build_it=False,
        schema="(Tensor x, float a=1.0, bool b=True, int[2] c=[1,2], str? s=None) -> Tensor",
    )
    for f in res.files:
        if f.suffix == ".py":
            compile(ast.parse(f.read_text()), str(f), "exec")


def test_amp_set_killed_before_its_build_is_finished_by_the_rerun(killed_and_rerun):
    """amp set recorded a policy and was killed before building it: the same amp set again builds it
    (it answered "already …: nothing to do" before), and then there is nothing left to do."""
    root, _ = killed_and_rerun
    killed = run_cli(
        "amp",
        "set",
        "add.Tensor",
        "lower_precision_fp",
        "--project",
        str(root),
        env={"BACKENDGEN_FAULT": "amp:written=SIGKILL"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert json.loads((root / "backendgen.json").read_text())["amp"]["add.Tensor"] == "lower_precision_fp"
    unbuilt = [f for f in api.check(root).findings if f.severity.value == "error"]
    assert any("add.Tensor" in f.message or "add.Tensor" in f.subject for f in unbuilt), unbuilt
    rerun = run_cli("amp", "set", "add.Tensor", "lower_precision_fp", "--no-test", "--project", str(root))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "was recorded as lower_precision_fp but not built (built)" in rerun.stdout, rerun.stdout
    assert api.check(root).exit_code == 0
    again = run_cli("amp", "set", "add.Tensor", "lower_precision_fp", "--project", str(root))
    assert again.returncode == 0 and "already lower_precision_fp: nothing to do" in again.stdout, again.stdout
