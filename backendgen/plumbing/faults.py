"""A test hook: make a command signal itself, or wait, at a named phase (tests/test_faults.py).

`BACKENDGEN_FAULT="PHASE=ACTION"` (several joined by `,`): when the command reaches PHASE it does
ACTION once — `SIGTERM`, `SIGHUP`, `SIGINT` or `SIGKILL` sends that signal to its own process,
`wait` blocks until a signal arrives (for a test that delivers one from outside). With
`BACKENDGEN_FAULT_LOG=FILE` every phase reached (and every child process started, with its process
group) is appended to FILE as `PHASE PID`, so a test can wait for a phase and check afterwards that
no child outlived the command. Unset (always, outside tests), `reached` does nothing.

Phases: `add-op:written` (add-op's files and record written, before its build), `amp:written` (the
same for `amp set`), `new:rendered`
(the project moved into place, before its build), `build:child` (a program of the build or its
tests started: pip, setup.py, ninja, the link, pytest), `build:install` (before the built library
is copied into the package), `build:done` (the build succeeded, before its state is recorded).
"""

from __future__ import annotations

import os
import signal
import time

_done: set[str] = set()


def _actions() -> dict[str, str]:
    spec = os.environ.get("BACKENDGEN_FAULT", "")
    pairs = (item.partition("=") for item in spec.split(",") if item.strip())
    return {phase.strip(): action.strip() for phase, _, action in pairs}


def _log(phase: str, pid: int) -> None:
    path = os.environ.get("BACKENDGEN_FAULT_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{phase} {pid}\n")


def reached(phase: str) -> None:
    """The command reached `phase`: log it and do what BACKENDGEN_FAULT asks there (once)."""
    if "BACKENDGEN_FAULT" not in os.environ and "BACKENDGEN_FAULT_LOG" not in os.environ:
        return
    _log(phase, os.getpid())
    action = _actions().get(phase)
    if action is None or phase in _done:
        return
    _done.add(phase)
    if action == "wait":
        _sleep_until_signalled()
    elif action.startswith("SIG"):
        os.kill(os.getpid(), signal.Signals[action])


def child_started(proc) -> None:
    """A child process (in a process group of its own) started: phase `build:child` when it is the build's."""
    if "BACKENDGEN_FAULT" in os.environ or "BACKENDGEN_FAULT_LOG" in os.environ:
        _log("child", proc.pid)


def _sleep_until_signalled(seconds: float = 600.0) -> None:
    """Wait for a signal (the fault hook's `wait`): returns after `seconds` if none came."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
