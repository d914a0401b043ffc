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


def log(msg: str) -> None:
    print(f"[matrix] {msg}", file=sys.stderr, flush=True)


def versions_needed(items) -> list[str]:
    """The versions the selected tests' `torch_venv` marks name, in the order the tests need them."""
    return list(dict.fromkeys(v for item in items for mark in item.iter_markers(MARK) for v in mark.args))


def _outer_ccache() -> str | None:
    return shutil.which("ccache") or next(
        (str(p) for p in [Path(sys.executable).parent / "ccache"] if p.is_file()), None
    )


class Venv:
    def __init__(self, path: Path, torch_version: str, tools: Path | None):
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
        start = time.monotonic()
        proc = subprocess.run(
            list(args),
            cwd=cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        log(f"torch {self.torch_version}: {' '.join(args)} -> {proc.returncode} in {time.monotonic() - start:.0f} s")
        return proc

    def uninstall_backends(self) -> None:
        for dist in sorted(self.backends):
            subprocess.run(
                [self.python, "-m", "pip", "uninstall", "-y", "-q", dist], capture_output=True, env=self.env()
            )
        self.backends.clear()


class TorchVenvs:
    """Makes the venvs of `versions` in a background thread, one at a time, under `nice`."""

    def __init__(self, base: Path, versions: list[str]):
        self.base = base
        self.versions = versions
        self.timings: dict[str, float] = {}
        self._done = {v: threading.Event() for v in versions}
        self._made: dict[str, Venv] = {}
        self._failed: dict[str, str] = {}
        self._stop = threading.Event()
        self._urgent = threading.Event()  # a test waits: no more `nice` until it has its venv
        self._proc: subprocess.Popen | None = None
        self.tools: Path | None = None
        ccache = _outer_ccache()
        if versions and ccache:
            from backendgen.toolchain import processes

            processes.ccache_dir()  # backendgen's compiler links to ccache, made by this environment's ccache
            self.tools = base / "tools"
            self.tools.mkdir()
            (self.tools / "ccache").symlink_to(ccache)
        self._thread = threading.Thread(target=self._make_all, name="torch-venvs", daemon=True)
        if versions:
            self._thread.start()

    def _run(self, args: list[str], env: dict | None = None, timeout: float = 1800) -> tuple[int, str]:
        nice = [] if self._urgent.is_set() else ["nice", "-n", "19"]
        self._proc = subprocess.Popen(
            [*nice, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )  # a process group: pip's children too
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, 9)
            out, _ = self._proc.communicate()
            return -1, f"timed out after {timeout:.0f} s\n{out}"
        return self._proc.returncode, out

    def _make_all(self) -> None:
        start = time.monotonic()
        rc, out = self._run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(self.base / "wheel"), str(REPO)]
        )
        wheels = list((self.base / "wheel").glob("backendgen-*.whl"))
        self.timings["wheel of this repo"] = time.monotonic() - start
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
        venv = Venv(path, version, self.tools)
        # a plain install: what the generated tests need (pytest, numpy, expecttest) comes as
        # backendgen's own dependencies
        rc, out = self._run(
            [venv.python, "-m", "pip", "install", "-q", f"torch=={version}", str(wheel)], env=venv.env()
        )
        self.timings[f"install torch {version}"] = time.monotonic() - start
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
            # the session has nothing else to run: the install gets the CPU back (where allowed)
            self._urgent.set()
            proc = self._proc
            try:
                if proc is not None and proc.poll() is None:
                    os.setpriority(os.PRIO_PGRP, proc.pid, 0)
            except OSError:  # lowering a niceness needs privileges
                pass
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
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, 15)
            except OSError:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        for venv in self._made.values():
            venv.uninstall_backends()
        for version in self.versions:
            shutil.rmtree(self.base / f"venv-{version}", ignore_errors=True)
        if self.timings:
            log("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.timings.items()))


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
