"""Runs a user's script under `backendgen profile` and writes the backend's fallback counters.

argv: RESULT_FILE DEVICE SCRIPT ARGS... It imports torch (autoload on: the backend loads), resets
`torch.<DEVICE>`'s fallback counters, runs SCRIPT with `runpy` as `python SCRIPT ARGS...` would
(its directory first on sys.path, its argv, its traceback), and when the interpreter exits (after
the script returns, raises or calls sys.exit, and before an os._exit) writes RESULT_FILE as JSON:
{"stats": {op: [calls, seconds or null]}, "seconds", "status"}, or {"error": "import" | "not_loaded"
| "collect", ...} when there is nothing to count.
"""

import atexit
import json
import os
import sys
import time
import traceback

from backendgen.plumbing.files import write_atomic


def _write(path: str, data: dict) -> None:
    write_atomic(path, json.dumps(data))


def main() -> int:
    result, device, script = sys.argv[1:4]
    state = {"status": None, "start": None, "written": False, "pid": os.getpid()}
    try:
        import torch
    except BaseException as e:  # noqa: BLE001 - reported to backendgen
        _write(result, {"error": "import", "detail": f"{type(e).__name__}: {e}"})
        return 2
    mod = getattr(torch, device, None)
    if mod is None or not (hasattr(mod, "fallback_stats") or hasattr(mod, "fallback_counts")):
        _write(result, {"error": "not_loaded"})
        return 2

    def collect():
        if state["written"] or os.getpid() != state["pid"]:  # once; never from a forked child
            return
        state["written"] = True
        seconds = time.perf_counter() - state["start"]
        try:
            if hasattr(mod, "fallback_stats"):
                stats = {k: [int(c), float(s)] for k, (c, s) in mod.fallback_stats().items()}
            else:  # a backend from before the fallback timed its operators
                stats = {k: [int(c), None] for k, c in mod.fallback_counts().items()}
        except BaseException as e:  # noqa: BLE001 - reported to backendgen
            _write(result, {"error": "collect", "detail": f"{type(e).__name__}: {e}", "status": state["status"]})
            return
        _write(result, {"stats": stats, "seconds": seconds, "status": state["status"]})

    real_os_exit = os._exit

    def os_exit(code):
        state["status"] = code
        collect()
        real_os_exit(code)

    atexit.register(collect)  # registered before the script's: runs after them, and after its threads
    os._exit = os_exit

    if hasattr(mod, "reset_fallback_counts"):
        mod.reset_fallback_counts()
    sys.argv = [script] + sys.argv[4:]
    if not getattr(sys.flags, "safe_path", False):  # `python SCRIPT` puts the script's directory first (not with -P)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    state["start"] = time.perf_counter()
    status = 0
    try:
        import runpy

        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:  # noqa: BLE001 - shown as `python SCRIPT` shows it
        tb = e.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != os.path.abspath(script):
            tb = tb.tb_next  # the script's frames only, as `python SCRIPT` shows them
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        status = 130 if isinstance(e, KeyboardInterrupt) else 1
    state["status"] = status
    return status


if __name__ == "__main__":
    sys.exit(main())
