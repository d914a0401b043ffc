"""Progress lines: one per step, with its time. The library reports; the CLI decides how to show it."""

from __future__ import annotations

import contextlib
import time


class Reporter:
    """Silent by default (library use, tests)."""

    def step_done(self, name: str, seconds: float, ok: bool) -> None:
        pass

    def note(self, text: str) -> None:
        """Something the user should know that is not an error (e.g. an untested torch)."""

    @contextlib.contextmanager
    def step(self, name: str):
        start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.step_done(name, time.monotonic() - start, ok)


class ConsoleReporter(Reporter):
    def __init__(self, out, quiet: bool = False):
        self.out = out  # a backendgen.cli.output.Output
        self.quiet = quiet

    def note(self, text):
        if not self.quiet:
            self.out.print(f"note: {text}")

    def step_done(self, name, seconds, ok):
        from backendgen.cli.output import styled

        if not self.quiet or not ok:
            mark = "✓" if ok else "✗"
            if not self.out.can_show(mark):
                mark = "ok" if ok else "FAILED"
            mark = styled(mark, "green" if ok else "red")
            self.out.print(mark, f" {name} ", styled(f"{seconds:.1f} s", "dim"))
