"""Progress: the steps of a command, and what a running step's child processes have done so far.

The library reports (`Reporter.step`); the CLI decides how to show it (backendgen.cli.progress: live
on a terminal, one line per finished step elsewhere). A step whose work runs in a child process may
name the files that child writes as it works (`Watch`): ninja's build log, whose `[done/total]`
lines count the compile units, and the event file of the pytest plugin
`backendgen.programs.pytest_progress`, which counts the tests. `Watcher` reads them incrementally;
nothing here imports more than the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Watch:
    """Files a step's child writes while it runs (either may be None)."""

    log: Path | None = None  # a build log: ninja's "[3/12] ..." lines
    events: Path | None = None  # backendgen.programs.pytest_progress's event file (BACKENDGEN_PROGRESS)


@dataclass
class Snapshot:
    """What a step's children have done so far."""

    units: tuple[int, int] | None = None  # (compiled, of total) by ninja's last status line
    tests_total: int | None = None
    tests_done: int = 0
    tests_failed: int = 0

    def describe(self) -> str:
        """E.g. "12/40 units" or "118/250 tests, 2 failed"; "" when nothing is known yet."""
        parts = []
        if self.units is not None:
            parts.append(f"{self.units[0]}/{self.units[1]} units")
        if self.tests_total is not None:
            failed = f", {self.tests_failed} failed" if self.tests_failed else ""
            parts.append(f"{self.tests_done}/{self.tests_total} tests{failed}")
        return ", ".join(parts)


_NINJA_STATUS = re.compile(rb"^\[(\d+)/(\d+)\]", re.MULTILINE)


@dataclass
class _Tail:
    """The part of a file written since the last read; a file older than `since` (left by an earlier
    run) or rewritten from its start is read again from the beginning."""

    path: Path
    since: float
    offset: int = 0
    partial: bytes = b""

    def new_lines(self) -> list[bytes]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_mtime < self.since:
            return []
        if st.st_size < self.offset:
            self.offset, self.partial = 0, b""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return lines


@dataclass
class Watcher:
    """Reads a `Watch`'s files as they grow (call `poll` as often as the display refreshes)."""

    watch: Watch
    since: float = field(default_factory=time.time)  # files last written before this are stale
    _snapshot: Snapshot = field(default_factory=Snapshot)
    _failed: set = field(default_factory=set)
    _tails: dict = field(default_factory=dict)

    def _tail(self, path: Path | None) -> _Tail | None:
        if path is None:
            return None
        return self._tails.setdefault(path, _Tail(path, self.since - 1))

    def poll(self) -> Snapshot:
        log = self._tail(self.watch.log)
        if log is not None:
            found = _NINJA_STATUS.findall(b"\n".join(log.new_lines()))
            if found:
                done, total = found[-1]
                self._snapshot.units = (int(done), int(total))
        events = self._tail(self.watch.events)
        for raw in events.new_lines() if events is not None else []:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            self._count(event)
        return self._snapshot

    def _count(self, event: dict) -> None:
        s = self._snapshot
        if "collected" in event:
            s.tests_total, s.tests_done, s.tests_failed = len(event["collected"]), 0, 0
            self._failed.clear()
        elif "finish" in event:
            s.tests_done += 1
        elif event.get("outcome") == "failed" and event.get("report") not in self._failed:
            self._failed.add(event.get("report"))
            s.tests_failed += 1


class Reporter:
    """Silent by default (library use, tests)."""

    def step_done(self, name: str, seconds: float, ok: bool) -> None:
        pass

    def note(self, text: str) -> None:
        """Something the user should know that is not an error (e.g. an untested torch)."""

    @contextlib.contextmanager
    def step(self, name: str, watch: Watch | None = None):
        """A step of the command; `watch`: the files its child processes write as they work."""
        start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.step_done(name, time.monotonic() - start, ok)
