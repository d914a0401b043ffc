"""Fresh virtualenvs with each tested torch for tests/test_torch_matrix.py, made in the background.

Each is what it was before: a new virtualenv per version with `pip install torch==X <this repo's
wheel>` (a plain install, no extras; the wheel built once per session as `pip install <repo>` builds
it). What changed is when: installing a CUDA torch (~5.4 GB) takes 1.5-2 minutes of mostly one core
and the disk, and it used to sit inside the matrix tests' own time at the end of the session. A test
that needs them is marked `torch_venv(version, ...)`; when the selected tests include one, the
session fixture `torch_venvs` (tests/conftest.py, autouse) starts a thread that makes them one after
another, in the order the tests need them, under `nice` (the session's builds keep the CPU they
need), so they are ready when the matrix starts. `TorchVenvs.get(version)` waits for its venv; while
a test waits, the install runs at normal priority.
No selected test marked: nothing is installed.

The tests' work runs in the background too. A mark may name the test's scenario,
`torch_venv(version, ..., scenario=fn)`: `fn(venvs, work, **params)` (params: the test's
parametrization) is what the test used to run in its body, every command and every assertion.
RUNNERS threads run the selected tests' scenarios, each taking the first in the tests' order whose
venvs are made and not in use by another (one venv runs one scenario at a time: one PrivateUse1
backend per environment), under `nice` like the installs: they use the CPU the session's own builds
and suites leave idle (the generated suites run on one core). Several, because the session's last
minutes are the matrix's: with one thread, each scenario started only when the one before it ended,
and the last ones ran one after the other on a machine otherwise half idle (a generated suite, most
of a scenario, uses one core of two); `.ci/run` went from 1919 to 1706 s with three (both from a
fresh clone with every cache empty: docs/performance.md). The test itself waits for its scenario's
outcome (`TorchVenvs.outcome`) and raises what it raised, with its traceback; while it waits, the
scenarios get normal priority.
The session's summary ends with the background's timeline (`TIMELINE`: each install and each
command, in seconds from the session's start), to read where its last minutes went.

A virtualenv's PATH is the user's, without the outer test run's venv; ccache is on it (a directory
holding only `ccache`), as on a CI machine with ccache installed, so the venvs' builds go through it
like every other build of the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "torch_venv"
RUNNERS = 3  # threads running scenarios side by side (see the top of this file)
# (start, end, what) of every install and scenario command, in seconds from the session's start:
# appended from the background threads, printed by tests/conftest.py's terminal summary
TIMELINE: list[tuple[float, float, str]] = []
_SESSION_START = time.monotonic()
# _NICE_WORKS: with the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled, on by
# default), each session (setsid) is a scheduling group of its own, and the groups share the CPU
# equally whatever their processes' nice values: a background command started in a new session
# (start_new_session=True) under `nice -n 19` took half the CPU from the session's builds (seen
# here: the session's first cold build took 293 s, 70 s alone). The background commands therefore
# run in a process group of their own (stopped and reniced as a group) inside the test session's
# own session, where `nice` orders them behind the foreground.


def log(msg: str) -> None:
    # the process's own stderr, not sys.stderr as it is now: this runs on background threads, while
    # a test in the foreground may have swapped sys.stderr for its own capture (typer's CliRunner),
    # whose output the test then reads (CI of 2026-12-07: a matrix line in `build --wheel`'s error)
    print(f"[matrix] {msg}", file=sys.__stderr__, flush=True)


def _span(start: float, what: str) -> None:
    TIMELINE.append((start - _SESSION_START, time.monotonic() - _SESSION_START, what))


def versions_needed(items) -> list[str]:
    """The versions the selected tests' `torch_venv` marks name, in the order the tests need them."""
    return list(dict.fromkeys(v for item in items for mark in item.iter_markers(MARK) for v in mark.args))


def scenarios_needed(items) -> list[tuple[str, tuple[str, ...], object, dict]]:
    """(test id, versions, scenario, params) of the selected tests whose `torch_venv` mark names a
    scenario, in the tests' order."""
    out = []
    for item in items:
        for mark in item.iter_markers(MARK):
            if "scenario" in mark.kwargs:
                params = dict(getattr(item, "callspec", None).params) if hasattr(item, "callspec") else {}
                out.append((item.nodeid, tuple(mark.args), mark.kwargs["scenario"], params))
    return out


def _outer_ccache() -> str | None:
    return shutil.which("ccache") or next(
        (str(p) for p in [Path(sys.executable).parent / "ccache"] if p.is_file()), None
    )


class Venv:
    def __init__(self, path: Path, torch_version: str, tools: Path | None, owner: TorchVenvs | None = None):
        self.owner = owner  # whose priority (background or a test waiting) the commands run at
        self.path = path
        self.torch_version = torch_version
        self.bin = path / "bin"
        self.python = str(self.bin / "python")
        self.tools = tools
        self.backends: set[str] = set()  # dist names installed into it by a test (uninstalled after it)

    def env(self) -> dict[str, str]:
        """The environment of a user who activated this venv: nothing of the outer test run."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "VIRTUAL_ENV",
                "PYTHONPATH",
                "PYTHONHOME",
                "PYTEST_ADDOPTS",
                "PYTEST_CURRENT_TEST",
                "TORCH_DEVICE_BACKEND_AUTOLOAD",
            )
        }
        outer_bin = str(Path(sys.executable).parent)
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != outer_bin]
        env["PATH"] = os.pathsep.join([str(self.bin), *path, *([str(self.tools)] if self.tools else [])])
        env["VIRTUAL_ENV"] = str(self.path)
        # A machine-wide pip constraint can cap torch below a tested release (this repo's CI machine
        # has had /etc/xdg/pip capping it at 2.14.1): these venvs install exact versions, uncapped.
        env["PIP_CONSTRAINT"] = os.devnull
        return env

    def run(self, *args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
        """`args` in this venv, as its user runs them; in the background (owner set) `timeout` is CPU
        seconds (see wait_measured), otherwise wall seconds."""
        start = time.monotonic()
        if self.owner is None:
            proc = subprocess.run(
                list(args),
                cwd=cwd,
                env=self.env(),
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )
        else:
            proc = self.owner.run_niced(list(args), cwd=cwd, env=self.env(), timeout=timeout)
        log(f"torch {self.torch_version}: {' '.join(args)} -> {proc.returncode} in {time.monotonic() - start:.0f} s")
        shown = " ".join(Path(a).name if a.startswith("/") else a for a in args)
        cpu = f" ({proc.cpu:.0f} CPU-s)" if hasattr(proc, "cpu") else ""
        _span(start, f"torch {self.torch_version}: {shown[:90]} -> {proc.returncode}{cpu}")
        return proc

    def uninstall_backends(self) -> None:
        for dist in sorted(self.backends):
            subprocess.run(
                [self.python, "-m", "pip", "uninstall", "-y", "-q", dist], capture_output=True, env=self.env()
            )
        self.backends.clear()


class TorchVenvs:
    """Makes the venvs of `versions` in a background thread, one at a time, under `nice`."""

    def __init__(self, base: Path, versions: list[str], scenarios: list | None = None):
        self.base = base
        self.versions = versions
        self.scenarios = scenarios or []
        self._outcomes: dict[str, BaseException | None] = {}
        self._scenario_done = {nodeid: threading.Event() for nodeid, *_ in self.scenarios}
        self._pending = list(self.scenarios)  # not yet taken by a runner (under _lock)
        self._in_use: set[str] = set()  # versions whose venv a running scenario has (under _lock)
        self._lock = threading.Lock()
        self._scenario_procs: set[subprocess.Popen] = set()  # the runners' commands now running
        self.timings: dict[str, float] = {}
        self._done = {v: threading.Event() for v in versions}
        self._made: dict[str, Venv] = {}
        self._failed: dict[str, str] = {}
        self._stop = threading.Event()
        self._urgent = threading.Event()  # a test waits: no more `nice` until it has its venv
        self._proc: subprocess.Popen | None = None
        self.last_cpu = 0.0  # CPU seconds of the last install command
        self.tools: Path | None = None
        ccache = _outer_ccache()
        if versions and ccache:
            from backendgen.toolchain import processes

            processes.ccache_dir()  # backendgen's compiler links to ccache, made by this environment's ccache
            self.tools = base / "tools"
            self.tools.mkdir()
            (self.tools / "ccache").symlink_to(ccache)
        self._thread = threading.Thread(target=self._make_all, name="torch-venvs", daemon=True)
        self._runners = [
            threading.Thread(target=self._run_scenarios, name=f"torch-venv-scenarios-{i}", daemon=True)
            for i in range(min(RUNNERS, len(self.scenarios)))
        ]
        if versions:
            self._thread.start()
        for runner in self._runners:
            runner.start()

    # ---- the tests' scenarios, in the background ----------------------------------------------------

    def _take(self):
        """The next scenario for a runner: the first in the tests' order whose venvs are made and not
        in use by another runner (then marked in use); None when none is left; "wait" when none is ready."""
        with self._lock:
            if not self._pending:
                return None
            free = (
                s
                for s in self._pending
                if all(self._done[v].is_set() for v in s[1]) and not self._in_use.intersection(s[1])
            )
            ready = next(free, None)
            if ready is None:
                if not self._stop.is_set():
                    return "wait"
                ready = self._pending[0]  # the session ended: _run_scenario says so, using no venv
            self._pending.remove(ready)
            self._in_use.update(ready[1])
            return ready

    def _run_scenarios(self) -> None:
        while (taken := self._take()) is not None:
            if taken == "wait":
                time.sleep(0.5)
                continue
            try:
                self._run_scenario(*taken)
            finally:
                with self._lock:
                    self._in_use.difference_update(taken[1])

    def _run_scenario(self, nodeid: str, versions: tuple[str, ...], scenario, params: dict) -> None:
        try:
            if self._stop.is_set():
                raise RuntimeError("the session ended before this scenario ran")
            for version in versions:
                if version not in self._made:
                    raise AssertionError(f"the venv with torch {version} was not made: {self._failed.get(version)}")
            work = self.base / ("scenario-" + "".join(c if c.isalnum() else "-" for c in nodeid)[-80:])
            work.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            try:
                scenario(self._background_get, work, **params)
            finally:
                _span(start, f"{nodeid.split('::')[-1]}: the whole scenario")
            log(f"{nodeid}: passed in {time.monotonic() - start:.0f} s (in the background)")
            self._outcomes[nodeid] = None
        except BaseException as exc:  # noqa: BLE001 - raised again by outcome(), in the test
            self._outcomes[nodeid] = exc
        finally:
            self._scenario_done[nodeid].set()

    def _background_get(self, version: str) -> Venv:
        """A scenario's venv: made by now (the runner waited for it)."""
        return self._made[version]

    def run_niced(self, args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        """A scenario's command: under `nice` unless a test is waiting for it, in a process group that
        outcome() can renice; its output captured like subprocess.run's."""
        nice = [] if self._urgent.is_set() else ["nice", "-n", "19"]
        proc = subprocess.Popen(
            [*nice, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            process_group=0,  # not a new session: see _NICE_WORKS
        )
        self._scenario_procs.add(proc)
        try:
            out, err, cpu = wait_measured(proc, cpu_limit=timeout)
        finally:
            self._scenario_procs.discard(proc)
        done = subprocess.CompletedProcess(args, proc.returncode, out, err)
        done.cpu = cpu  # shown in the timeline
        return done

    def outcome(self, nodeid: str) -> None:
        """Waits for the scenario of test `nodeid` and raises what it raised."""
        assert nodeid in self._scenario_done, f"{nodeid}: its torch_venv mark names no scenario"
        start = time.monotonic()
        if not self._scenario_done[nodeid].is_set():
            self._hurry()
            self._scenario_done[nodeid].wait()
            self._urgent.clear()
        waited = time.monotonic() - start
        self.timings["waited for the background"] = self.timings.get("waited for the background", 0) + waited
        if waited >= 1:
            log(f"{nodeid}: waited {waited:.0f} s for it in the background")
            _span(start, f"the session waited for {nodeid.split('::')[-1]}")
        exc = self._outcomes[nodeid]
        if exc is not None:
            raise exc

    def _hurry(self) -> None:
        """The session has nothing else to run: what runs in the background gets the CPU back (where allowed)."""
        self._urgent.set()
        for proc in (self._proc, *list(self._scenario_procs)):
            try:
                # returncode, never poll(): poll() reaps the process, and the thread in wait_measured
                # then finds no child to wait for (its CPU seconds lost with it)
                if proc is not None and proc.returncode is None:
                    os.setpriority(os.PRIO_PGRP, proc.pid, 0)
            except OSError:  # lowering a niceness needs privileges
                pass

    def _run(self, args: list[str], env: dict | None = None, timeout: float = 1800) -> tuple[int, str]:
        nice = [] if self._urgent.is_set() else ["nice", "-n", "19"]
        self._proc = subprocess.Popen(
            [*nice, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            process_group=0,  # not a new session: see _NICE_WORKS
        )  # a process group: pip's children too
        try:
            out, _, self.last_cpu = wait_measured(self._proc, cpu_limit=timeout)
        except Overran as exc:
            return -1, str(exc)
        return self._proc.returncode, out

    def _make_all(self) -> None:
        start = time.monotonic()
        rc, out = self._run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(self.base / "wheel"), str(REPO)]
        )
        wheels = list((self.base / "wheel").glob("backendgen-*.whl"))
        self.timings["wheel of this repo"] = time.monotonic() - start
        _span(start, f"pip wheel of this repo -> {rc}")
        for version in self.versions:
            try:
                if self._stop.is_set():
                    self._failed[version] = "the session ended first"
                elif rc != 0 or len(wheels) != 1:
                    self._failed[version] = f"pip wheel of this repo failed ({rc}):\n{out[-3000:]}"
                else:
                    self._make(version, wheels[0])
            except Exception as exc:  # noqa: BLE001 - reported by get(), in the test that needs the venv
                self._failed[version] = repr(exc)
            finally:
                self._done[version].set()

    def _make(self, version: str, wheel: Path) -> None:
        start = time.monotonic()
        path = self.base / f"venv-{version}"
        rc, out = self._run([sys.executable, "-m", "venv", str(path)])
        if rc != 0:
            self._failed[version] = out
            return
        venv = Venv(path, version, self.tools, owner=self)
        # a plain install: what the generated tests need (pytest, numpy, expecttest) comes as
        # backendgen's own dependencies. --no-compile: pip would byte-compile every one of torch's
        # modules (15 s of CPU measured here, per venv); the modules the tests import are compiled as
        # they are imported, the same files installed either way
        rc, out = self._run(
            [venv.python, "-m", "pip", "install", "-q", "--no-compile", f"torch=={version}", str(wheel)],
            env=venv.env(),
        )
        self.timings[f"install torch {version}"] = time.monotonic() - start
        _span(start, f"venv with torch {version} -> {rc} ({self.last_cpu:.0f} CPU-s)")
        if rc != 0:
            self._failed[version] = out[-6000:]
            return
        log(
            f"venv with torch {version}: {self.timings[f'install torch {version}']:.0f} s in the background, "
            f"{_du(path) / 2**30:.1f} GiB"
        )
        self._made[version] = venv

    def get(self, version: str) -> Venv:
        """The venv of `version` (a test marked torch_venv(version)), once it is made."""
        assert version in self._done, f"mark the test pytest.mark.{MARK}({version!r}): its venv is made in advance"
        start = time.monotonic()
        if not self._done[version].is_set():
            self._hurry()
            self._done[version].wait()
            self._urgent.clear()
        waited = time.monotonic() - start
        self.timings[f"waited for torch {version}"] = self.timings.get(f"waited for torch {version}", 0) + waited
        if waited >= 1:
            log(f"waited {waited:.0f} s for the venv with torch {version}")
        assert version in self._made, f"the venv with torch {version} was not made: {self._failed.get(version)}"
        return self._made[version]

    def close(self) -> None:
        """At the session's end: stop an install still running, delete the venvs (several GB each)."""
        self._stop.set()
        for proc in (self._proc, *list(self._scenario_procs)):
            if proc is not None and proc.returncode is None:  # not poll(): see _hurry
                try:
                    os.killpg(proc.pid, 15)
                except OSError:
                    pass
        for thread in (self._thread, *self._runners):
            if thread.is_alive():
                thread.join(timeout=60)
        for venv in self._made.values():
            venv.uninstall_backends()
        for version in self.versions:
            shutil.rmtree(self.base / f"venv-{version}", ignore_errors=True)
        if self.timings:
            log("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.timings.items()))


_TICK = os.sysconf("SC_CLK_TCK")
STALL = 300.0  # s of wall time in which a background command used no CPU at all: it hangs


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by process `root` and every process below it: their own and those of
    the children they reaped (a build's compilers are counted in ninja, ninja in backendgen, ...).
    The tree, not the process group: backendgen runs a build in a process group of its own."""
    children: dict[int, list[int]] = {}
    used: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)  # after the name: state, ppid, ..., utime at 11
        used[pid] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICK


class Overran(Exception):
    """A background command killed by wait_measured: what it overran, and its output so far."""

    def __init__(self, why: str, out: str, err: str):
        super().__init__(f"{why}\n--- its output's end ---\n{out[-3000:]}{err[-3000:]}")
        self.out, self.err = out, err


def wait_measured(proc: subprocess.Popen, cpu_limit: float, stall: float = STALL) -> tuple[str, str, float]:
    """(stdout, stderr, CPU seconds) of `proc`, the leader of its process group, once it ends (the
    CPU of every process it and its children waited for, from wait4).

    A background command runs under `nice` behind the session's own tests, so its wall time says
    little: at nice 19 beside two busy cores it gets a few per cent of one (the CI machine's `new`
    on torch 2.14.1 passed 900 s of wall time with its build half done). What it is held to is the
    CPU it and its children use: killed (Overran) past `cpu_limit` CPU seconds (a runaway), or after `stall`
    seconds in which it used none (a hang: a process the scheduler starves still gets its share).
    `stall` is an argument, not the module's STALL patched by a test: the matrix's scenarios call this
    from background threads while the session's tests run, and a test's shorter STALL killed them
    (CI of 2026-12-07: two scenarios at nice 19 "used no CPU for 2 s" behind a busy foreground)."""
    streams = {"out": proc.stdout, "err": proc.stderr}
    read: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda k=k, f=f: read.__setitem__(k, f.read() if f else ""), daemon=True)
        for k, f in streams.items()
    ]
    for reader in readers:
        reader.start()
    last, idle_since, why = 0.0, time.monotonic(), None
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # another thread reaped it (Popen.poll or wait): its exit code is on proc
            if proc.returncode is None:
                raise
            status, usage = None, None
            break
        if pid:
            break
        used = tree_cpu(proc.pid)
        now = time.monotonic()
        if used > last + 0.05:
            last, idle_since = used, now
        if used > cpu_limit:
            why = f"used more than {cpu_limit:.0f} s of CPU"
        elif now - idle_since > stall:
            why = f"used no CPU for {stall:.0f} s (it hangs)"
        if why:
            os.killpg(proc.pid, 9)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(1)
    if status is not None:
        proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    for f in streams.values():
        if f:
            f.close()
    out, err = read.get("out") or "", read.get("err") or ""
    if why:
        raise Overran(f"{' '.join(map(str, proc.args))}: {why}", out, err)
    # reaped elsewhere: the CPU last seen in its tree stands for what wait4 would have said
    return out, err, (usage.ru_utime + usage.ru_stime) if usage else last


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
