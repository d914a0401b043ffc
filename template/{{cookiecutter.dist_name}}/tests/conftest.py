"""Shared fixtures of the {{ cookiecutter.device }} backend's tests."""

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from typing import ClassVar

import pytest
import torch

import {{ cookiecutter.package }}  # noqa: F401  (works with TORCH_DEVICE_BACKEND_AUTOLOAD=0 too)

DEVICE = "{{ cookiecutter.device }}"


# The driver's optional capabilities (csrc/driver/driver.h: host_mapping, host_tasks, spin,
# memory_limit, tracing, graphs). A test that needs one is marked with requires(...) and skips, naming it,
# on a driver without it (the minimal driver has none); nothing else depends on them.
CAPABILITIES = getattr(torch, DEVICE).capabilities()


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Skips the test (a module: `pytestmark = requires(...)`) unless the driver has every one of
    `capabilities`; the reason names those it lacks."""
    missing = [c for c in capabilities if c not in CAPABILITIES]
    names = " and ".join(f"'{c}'" for c in missing)
    return pytest.mark.skipif(
        bool(missing),
        reason=f"the {DEVICE} driver lacks the {names} capabilit{'y' if len(missing) == 1 else 'ies'} (driver.h)",
    )


# Kernels queued on a stream, the host returning before they run: the template's kernels are host
# code (aten/kernel_support.cpp), queued with host_tasks on host-mapped memory; otherwise each runs
# on the calling thread, staged, before the call returns.
queued_kernels = requires("host_tasks", "host_mapping")

# Copies within the device and non_blocking ones queued on a stream: the driver's memcpy_async
# queues them on a driver without host_mapping; with host_mapping they are host code (the CPU copy
# on host views), queued only with host_tasks.
queued_copies = pytest.mark.skipif(
    "host_mapping" in CAPABILITIES and "host_tasks" not in CAPABILITIES,
    reason=f"the {DEVICE} driver has 'host_mapping' but lacks the 'host_tasks' capability (driver.h): "
    "its copies are host code, run before the call returns",
)


@pytest.fixture
def mod():
    """torch.{{ cookiecutter.device }}"""
    return getattr(torch, DEVICE)


# ---- fresh processes ------------------------------------------------------------------------------
# Exit behaviour, lazy initialisation, fork and crashes are seen only in a process of their own. An
# interpreter start costs seconds (`import torch`), so the session keeps a zygote: an interpreter
# that has done nothing but `import torch` (autoload on: the backend is loaded, its device not
# initialised) and forks a child per snippet. The child is that user's process right after
# `import torch`: it runs the snippet as `python -c` does (its own __main__, stdout, stderr and exit
# status) and ends through the interpreter's normal finalization, as a script does. What happens at
# import (autoload off, another backend first) still needs a new interpreter: env=... or fresh=True.
# A test module declares its snippets with fresh_process(...): they start when the session starts
# and run beside the other tests; run_python runs one on the spot.

_ZYGOTE = r"""
import json, os, select, sys
requests, replies = os.dup(0), os.dup(1)
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
import torch  # all a user's process has done when the snippet's first line runs
assert not torch.{{ cookiecutter.device }}.is_initialized(), "import torch initialised the device"
pending, batches, running, child = b"", [], {}, None
while child is None:
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        os.write(replies, b"%d %d\n" % (running.pop(pid), os.waitstatus_to_exitcode(status)))
    while batches and len(running) < 2:  # a batch's processes start together; two batches at most
        for request in batches.pop(0):
            pid = os.fork()
            if pid == 0:
                child = request
                break
            running[pid] = request["id"]
        else:
            continue
        break
    if child is None and select.select([requests], [], [], 0.005 if running else None)[0]:
        chunk = os.read(requests, 1 << 16)
        if not chunk:
            sys.exit(0)
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            batches.append(json.loads(line))
# the child: from here on it is `python -c child["code"]`
os.close(requests)
os.close(replies)
for fd, path in ((1, child["stdout"]), (2, child["stderr"])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
os.environ.update(child["set_env"])
import types
main = types.ModuleType("__main__")
sys.modules["__main__"], sys.argv = main, ["-c"]
exec(compile(child["code"], "<string>", "exec"), main.__dict__)
"""


class _Zygote:
    """The session's zygote process and the snippets its children run."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}  # autoload on
        self.tmp = tempfile.mkdtemp(prefix="fresh-processes-")
        with open(os.path.join(self.tmp, "zygote.stderr"), "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=stderr, env=env)
        self.next_id, self.finished, self.pending = 0, {}, b""

    def start(self, codes: list[str], set_env: dict[str, str] | None = None) -> list[int]:
        """Queues `codes`, to start together; returns their runs' ids."""
        batch = []
        for code in codes:
            self.next_id += 1
            paths = {name: os.path.join(self.tmp, f"{self.next_id}.{name}") for name in ("stdout", "stderr")}
            for path in paths.values():
                open(path, "w").close()
            batch.append({"id": self.next_id, "code": code, "set_env": set_env or {}, **paths})
        self.proc.stdin.write(json.dumps(batch).encode() + b"\n")
        self.proc.stdin.flush()
        return [r["id"] for r in batch]

    def wait(self, run: int, code: str) -> subprocess.CompletedProcess:
        deadline = time.monotonic() + 300
        while run not in self.finished:
            while b"\n" not in self.pending:
                left = deadline - time.monotonic()
                assert left > 0 and select.select([self.proc.stdout], [], [], left)[0], f"no end in 300 s: {code}"
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert chunk, f"the zygote died (exit status {self.proc.wait()}): {self._stderr()}"
                self.pending += chunk
            line, _, self.pending = self.pending.partition(b"\n")
            finished, status = map(int, line.split())
            self.finished[finished] = status
        outputs = []
        for name in ("stdout", "stderr"):
            path = os.path.join(self.tmp, f"{run}.{name}")
            with open(path) as f:
                outputs.append(f.read())
            os.unlink(path)
        return subprocess.CompletedProcess([sys.executable, "-c", code], self.finished.pop(run), *outputs)

    def _stderr(self) -> str:
        with open(os.path.join(self.tmp, "zygote.stderr")) as f:
            return f.read()[-4000:]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=300)
        shutil.rmtree(self.tmp, ignore_errors=True)


_zygote: _Zygote | None = None


def _the_zygote() -> _Zygote:
    global _zygote
    if _zygote is None:
        _zygote = _Zygote()
    return _zygote


class fresh_process:
    """`code` run as run_python runs it (`copies` times, together), declared at a test module's top
    level: it starts when the session starts, if a test of the module is collected, and runs while
    other tests do; results() waits for it."""

    declared: ClassVar[list["fresh_process"]] = []

    def __init__(self, code: str, *, copies: int = 1, set_env: dict[str, str] | None = None, env=None):
        self.code, self.copies, self.set_env, self.env = code, copies, set_env, env
        self.module = sys._getframe(1).f_globals["__name__"]
        self.runs: list | None = None
        self.done: list[subprocess.CompletedProcess] | None = None
        fresh_process.declared.append(self)

    def start(self):
        if self.runs is None:
            if self.env is not None:  # a new interpreter
                self.runs = [subprocess.Popen([sys.executable, "-c", self.code], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, env=self.env)
                             for _ in range(self.copies)]
            else:
                self.runs = _the_zygote().start([self.code] * self.copies, self.set_env)

    def results(self) -> list[subprocess.CompletedProcess]:
        if self.done is None:
            self.start()
            if self.env is None:
                self.done = [_the_zygote().wait(run, self.code) for run in self.runs]
            else:
                self.done = []
                for run in self.runs:
                    stdout, stderr = run.communicate(timeout=300)
                    self.done.append(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr))
        return self.done

    def result(self) -> subprocess.CompletedProcess:
        (only,) = self.results()
        return only


@pytest.hookimpl(trylast=True)  # after -k and -m deselected theirs
def pytest_collection_modifyitems(session, config, items):
    """Starts the declared fresh processes of the selected tests' modules (the zygote first)."""
    if config.option.collectonly:
        return
    modules = {getattr(getattr(item, "module", None), "__name__", None) for item in items}
    wanted = [f for f in fresh_process.declared if f.module in modules]
    if wanted or any(getattr(getattr(i, "module", None), "run_python", None) is run_python for i in items):
        _the_zygote()
    for f in sorted(wanted, key=lambda f: f.env is None):  # new interpreters first: they take longest
        f.start()


def pytest_sessionfinish(session, exitstatus):
    for f in fresh_process.declared:
        if f.env is not None and f.runs is not None and f.done is None:  # its test did not run
            for run in f.runs:
                run.kill()
                run.communicate()
    if _zygote is not None:
        _zygote.close()


def run_python(code: str, env=None, *, set_env: dict[str, str] | None = None,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """Runs `code` as `python -c code` in a process of its own (for exit behaviour, lazy
    initialisation, fork and crashes): a child of the session's zygote, a process that has done
    `import torch` and nothing else. `set_env`: variables set in it before `code` runs, for those the
    backend reads at their first use (not at import). `env` (the whole environment, as subprocess
    takes it) or `fresh`: a new interpreter, for what happens at import."""
    if env is not None or fresh:
        assert set_env is None, "a new interpreter takes its variables in env"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                              check=False)
    (run,) = _the_zygote().start([code], set_env)
    return _the_zygote().wait(run, code)


@pytest.fixture
def drained(mod):
    """Waits for the device's queued work after the test, so none of it runs into the next one."""
    yield
    mod.synchronize()


def fallback_warnings(mod, fn) -> list[str]:
    """The messages of the warnings `fn()` raises with the CPU fallback's warning on (counters reset
    first: it warns once per operator)."""
    mod.reset_fallback_counts()
    mod.set_fallback_warning(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        mod.set_fallback_warning(False)
    return [str(w.message) for w in caught]
