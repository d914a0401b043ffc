"""A clean interpreter exit after a backward pass on the device.

PyTorch runs the backward pass of device tensors on an autograd worker thread per device
("pt_autograd_N"). That thread drops its last reference to a finished pass shortly after
`backward()` returns, and the reference can hold a Python object. If the script ends in that
moment, the thread needs the GIL while the interpreter is finalizing, and the process aborts with
"terminate called without an active exception". Before exit, hand the GIL over for a moment
whenever such a thread exists. What a hardware team replaces: nothing.
"""

from __future__ import annotations

import atexit
import os
import time

_GRACE_SECONDS = 0.05


def _autograd_threads_running() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # no /proc: assume they may be
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if fh.read().startswith("pt_autograd_"):
                    return True
        except OSError:
            continue  # the thread ended meanwhile
    return False


def _let_autograd_threads_finish() -> None:
    if _autograd_threads_running():
        time.sleep(_GRACE_SECONDS)  # releases the GIL to the worker thread


def install() -> None:
    atexit.register(_let_autograd_threads_finish)
