"""How the CLI shows a command's steps (backendgen.plumbing.progress reports them).

On a terminal a running step is a live line, redrawn four times a second: the step, its elapsed
time, and what its child processes have done so far (compile units by ninja's count, tests done of
the total and failures so far). When the step ends the live line goes and the step's one line
stays: `✓ build 21.4 s (12/12 units)`. On a pipe, in a file or in CI (and with --quiet) there is no
live line: one plain line per step as it ends, as before, without the counts.
"""

from __future__ import annotations

import contextlib
import time

from backendgen.cli.output import Output, styled
from backendgen.plumbing.progress import Reporter, Snapshot, Watch, Watcher

REFRESH_PER_SECOND = 4


class ConsoleReporter(Reporter):
    def __init__(self, out: Output, quiet: bool = False, live: bool | None = None):
        self.out = out
        self.quiet = quiet
        # a live line only where someone watches: a terminal rich can redraw (not TERM=dumb)
        if live is None:
            live = not quiet and out.console.is_terminal and not out.console.is_dumb_terminal
        self.live = live

    def note(self, text):
        if not self.quiet:
            self.out.print(f"note: {text}")

    def step_done(self, name, seconds, ok, detail: str = ""):
        if not self.quiet or not ok:
            mark = "✓" if ok else "✗"
            if not self.out.can_show(mark):
                mark = "ok" if ok else "FAILED"
            mark = styled(mark, "green" if ok else "red")
            extra = [" ", styled(f"({detail})", "dim")] if detail else []
            self.out.print(mark, f" {name} ", styled(f"{seconds:.1f} s", "dim"), *extra)

    @contextlib.contextmanager
    def step(self, name: str, watch: Watch | None = None):
        if not self.live:
            with super().step(name, watch):
                yield
            return
        from rich.live import Live
        from rich.spinner import Spinner

        watcher = Watcher(watch or Watch())
        start = time.monotonic()
        last = Snapshot()
        # one spinner for the step: it animates by the time since it was made
        spinner = Spinner("dots" if self.out.can_show("⠋") else "line", style="cyan")

        def frame():
            nonlocal last
            last = watcher.poll()
            spinner.update(text=self._text(name, time.monotonic() - start, last))
            return spinner

        ok = False
        try:
            with Live(
                get_renderable=frame,
                console=self.out.console,
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
                redirect_stderr=False,
            ):
                yield
            ok = True
        finally:
            last = watcher.poll()
            self.step_done(name, time.monotonic() - start, ok, last.describe())

    def _text(self, name: str, seconds: float, snap: Snapshot):
        from backendgen.cli.output import line

        minutes, secs = divmod(int(seconds), 60)
        what = snap.describe()
        return line(f"{name} ", styled(f"{minutes}:{secs:02d}", "dim"), *([f"  {what}"] if what else []))
