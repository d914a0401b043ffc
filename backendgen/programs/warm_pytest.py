"""pytest started before a build is done (build.tests_started_early).

argv[1] is JSON: {"preload": [modules], "pytest": [pytest's arguments]}. Started with the backend's
autoload off (its library is still being built), it imports torch and the `preload` modules at a
lower priority, then waits; when "go" arrives on stdin it turns autoload back on (the tests use the
backend as a user would) and runs pytest in the same process (pytest_main: it exits when pytest is
done), which imports the backend then: the new library. Anything else on stdin (or its end) exits 0
without running the tests.
"""

import importlib
import json
import os
import sys

from backendgen.programs import pytest_main


def main() -> int:
    req = json.loads(sys.argv[1])
    os.nice(10)  # the compiler comes first
    importlib.import_module("torch")
    for name in req["preload"]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the test that needs it imports it again and reports the error
            continue
    if sys.stdin.readline().strip() != "go":
        return 0
    os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    pytest_main.run(req["pytest"])  # never returns
    return 1


if __name__ == "__main__":
    sys.exit(main())
