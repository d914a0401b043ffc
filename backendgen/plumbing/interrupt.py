"""Signals and child processes: the one place where SIGTERM and SIGHUP become the interrupt path.

`kill`, `timeout`, a cancelled CI job (SIGTERM) and a closed terminal (SIGHUP) must undo a
command's work exactly as Ctrl-C does. `install()` (called once by the CLI's entry point, and by
any program embedding the library that wants the same) makes both raise `Interrupted`, a
`KeyboardInterrupt`, so every transaction's rollback (`except BaseException`) and the CLI's
"interrupted" line cover them with no code of their own.

The programs a command starts (pip, setup.py, ninja, the compiler, pytest) run through `run` and
`popen`: each in a process group of its own, which is stopped (SIGTERM, then SIGKILL after a grace
period) when the command is interrupted or fails while it runs. A signal sent to backendgen's own
process alone (`kill PID`) therefore reaches the compiler too, and Ctrl-C in a terminal, which
reaches only the foreground group, still ends everything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from backendgen.plumbing import faults

# the signals that mean "stop and put things back", with the conventional exit status (128 + N)
SIGNALS = (signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 5.0  # what a child gets to clean up after SIGTERM (ninja stops its compilers)


class Interrupted(KeyboardInterrupt):
    """A stop request by signal; `exit_code` is 128 + the signal's number (130 for Ctrl-C)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit status for an interrupt: 128 + its signal (130 for a plain KeyboardInterrupt)."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + int(signal.SIGINT)


def _raise(signum, _frame):
    # a second signal while the rollback runs must not cut the rollback short
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def install() -> None:
    """Make SIGTERM and SIGHUP raise `Interrupted` in the main thread (call once, from the entry point)."""
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(sig, _raise)


def stop(proc: subprocess.Popen) -> None:
    """Stop `proc` and everything in its process group: SIGTERM, then SIGKILL after GRACE_SECONDS."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a grandchild left behind in the group
        return
    for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` in a process group of its own (stop it with `stop`)."""
    proc = subprocess.Popen(cmd, process_group=0, **kwargs)
    faults.child_started(proc)
    return proc


def run(
    cmd: list[str], *, timeout: float | None = None, phase: str | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """`subprocess.run` whose child (and its children) are stopped if this process is interrupted
    or the call fails; `input`, `capture_output` and `text` work as there. `phase`: the fault
    hook's phase (backendgen.plumbing.faults) reached once the child started."""
    input_ = kwargs.pop("input", None)
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    kwargs.pop("check", None)
    if input_ is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = popen(cmd, **kwargs)
    try:
        if phase is not None:
            faults.reached(phase)
        out, err = proc.communicate(input_, timeout=timeout)
    except BaseException:
        stop(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
