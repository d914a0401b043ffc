"""A pytest plugin for `backendgen test --pytorch-tests` (backendgen.toolchain.pytorch_tests), loaded
in the child pytest with `-p backendgen.programs.pytest_progress`; it imports nothing but the standard
library. The environment configures it:

- `BACKENDGEN_PROGRESS`: a file it appends one JSON object a line to, each written as it happens
  (one `write` per line, no buffer), so what a crashed process leaves behind says which test was
  running: `{"collected": [node ids]}`, `{"collect_error": id, "message": m}`, `{"start": id}`,
  `{"report": id, "when": "setup"|"call"|"teardown", "outcome": o, "xfail": bool, "message": m}`,
  `{"finish": id}`, `{"end": exit status}`.
- `BACKENDGEN_KEEP_CLASSES`: comma-separated class-name suffixes; only the tests of classes whose
  name ends with one run (one side of `instantiate_device_type_tests`: `CPU`, or `MYCHIP,PRIVATEUSE1`).
- `BACKENDGEN_DESELECT`: a file of node ids, one a line, not to run (they finished or crashed in an
  earlier run of the same file).
"""

from __future__ import annotations

import json
import os

PROGRESS = "BACKENDGEN_PROGRESS"
KEEP_CLASSES = "BACKENDGEN_KEEP_CLASSES"
DESELECT = "BACKENDGEN_DESELECT"
MAX_MESSAGE = 4000  # characters of a message kept: its first line is what is grouped

_fd: int | None = None


def _emit(event: dict) -> None:
    global _fd
    path = os.environ.get(PROGRESS)
    if not path:
        return
    if _fd is None:
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, (json.dumps(event) + "\n").encode("utf-8", "backslashreplace"))


def _message(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        text = ""
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None and getattr(crash, "message", None) else str(longrepr)
    if hasattr(report, "wasxfail"):
        text = "expected failure" + (f": {report.wasxfail}" if report.wasxfail else "") + (f": {text}" if text else "")
    return text[:MAX_MESSAGE]


def _class_of(nodeid: str) -> str | None:
    parts = nodeid.split("::")
    return parts[-2] if len(parts) >= 3 else None


def pytest_collection_modifyitems(session, config, items) -> None:
    suffixes = [s for s in os.environ.get(KEEP_CLASSES, "").split(",") if s]
    done: set[str] = set()
    path = os.environ.get(DESELECT)
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            done = {line.rstrip("\n") for line in fh if line.strip()}
    if not suffixes and not done:
        return
    kept, dropped = [], []
    for item in items:
        cls = _class_of(item.nodeid)
        wanted = not suffixes or (cls is not None and cls.endswith(tuple(suffixes)))
        (kept if wanted and item.nodeid not in done else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session) -> None:
    _emit({"collected": [item.nodeid for item in session.items]})


def pytest_collectreport(report) -> None:
    if report.failed:
        _emit({"collect_error": report.nodeid, "message": _message(report)})


def pytest_runtest_logstart(nodeid, location) -> None:
    _emit({"start": nodeid})


def pytest_runtest_logreport(report) -> None:
    _emit(
        {
            "report": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
            "message": "" if report.passed and not hasattr(report, "wasxfail") else _message(report),
        }
    )


def pytest_runtest_logfinish(nodeid, location) -> None:
    _emit({"finish": nodeid})


def pytest_sessionfinish(session, exitstatus) -> None:
    _emit({"end": int(exitstatus)})
