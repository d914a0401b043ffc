"""What reaches the user's terminal: the one place the CLI prints through.

backendgen's own words may carry a style, given explicitly with `styled()`; any other text (paths,
operator names, schemas, compiler and loader messages, error messages, the user's own arguments) is
outside text. Outside text is never read as rich markup (`[/bold]` stays `[/bold]`), and terminal
control characters in it (ESC and the sequences it starts, CR, BEL, other C0/C1 controls; not
newline or tab) are shown as escapes (`\\x1b`) instead of acting on the terminal.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from rich.text import Text

_UNWRAPPED = 100_000  # columns, when the output is a file or a pipe
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: object) -> str:
    """`text` with every control character but newline and tab replaced by its escape, e.g. `\\x1b`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def styled(text: object, style: str) -> Text:
    """backendgen's own styling of a piece of text (the text itself is still shown verbatim)."""
    return Text(visible(text), style=style)


def line(*parts: object) -> Text:
    """One piece of output from `parts`: a `styled()` part keeps its style, anything else is outside
    text, shown as it is."""
    out = Text()
    for part in parts:
        out.append(part if isinstance(part, Text) else Text(visible(part)))
    return out


def degrade_streams() -> None:
    """Let stdout and stderr write what their encoding cannot (`PYTHONIOENCODING=ascii`, a C locale)
    as backslash escapes instead of raising: a progress mark must never fail a command."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


class Output:
    """stdout (or stderr) of the CLI. Strings are never parsed as markup, emoji codes or highlights;
    a table cell is folded at the terminal's width, never cut, and not wrapped at all when the output
    is not a terminal (a log keeps each path and message on one line)."""

    def __init__(self, stderr: bool = False):
        from rich.console import Console

        self.console = Console(stderr=stderr, markup=False, emoji=False, highlight=False, soft_wrap=True)
        if not self.console.is_terminal and "COLUMNS" not in os.environ:
            self.console.width = _UNWRAPPED

    def can_show(self, text: str) -> bool:
        """Whether the stream's encoding has `text` (else use an ASCII stand-in: `✓` -> `ok`)."""
        encoding = getattr(self.console.file, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            return False
        return True

    def print(self, *parts: object) -> None:
        self.console.print(line(*parts))

    def table(self, columns: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
        """A borderless table; each cell is a `line()` part (outside text unless `styled()`)."""
        from rich.table import Table

        table = Table(box=None)
        for name in columns:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*(line(cell) for cell in row))
        self.console.print(table)
