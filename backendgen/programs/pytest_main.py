"""pytest, then the process ends at once: `python -m backendgen.programs.pytest_main ARGS...` runs
`pytest ARGS...` as `python -m pytest` would (the current directory first on sys.path).

A Python that has loaded torch, the backend and PyTorch's OpInfo database takes 1-2 s more to
shut down (finalizing modules, collecting garbage) after pytest is done. None of it is the tests':
when pytest.main returns, its report is written and its plugins are closed. So the process ends
there, with its output flushed and pytest's exit code (os._exit skips the interpreter's shutdown,
and the backend's atexit handlers, which a test session does not need).
"""

import os
import sys


def run(args: list[str]) -> None:
    import pytest

    code = pytest.main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


if __name__ == "__main__":
    run(sys.argv[1:])
