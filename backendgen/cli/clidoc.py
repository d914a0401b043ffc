"""docs/cli.md, the command-line reference, rendered from the typer app in `backendgen.cli.app`.

    python -m backendgen.cli.clidoc --write     # regenerate docs/cli.md after changing a command
    python -m backendgen.cli.clidoc --check     # exit 1 if docs/cli.md differs from the app

Every command, in the order the app registers them, with its summary, its full help, its usage
line, and a table of its arguments and options as `--help` describes them (the same help records,
taken from click's `get_help_record`). tests/test_clidoc.py fails when the file drifts.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent  # a source checkout (an installed wheel has no docs/)
DOC = ROOT / "docs" / "cli.md"
REGENERATE = "python -m backendgen.cli.clidoc --write"


def _md(text: str) -> str:
    """Text for a markdown table cell: pipes escaped; angle brackets escaped outside code spans."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _paragraphs(text: str) -> str:
    """A docstring's paragraphs, each joined to one line (the docs' own line breaks are not the help's)."""
    paras = [
        " ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", textwrap.dedent(text).strip())
    ]
    return "\n\n".join(_md(p) for p in paras if p)


def _table(title: str, records: list[tuple[str, str]]) -> list[str]:
    if not records:
        return []
    lines = [f"{title}:", "", f"| {title.lower().rstrip('s')} | description |", "|---|---|"]
    for opts, help_text in records:
        cell = opts.replace("|", "\\|")  # a pipe ends a table cell, in a code span too ([a|b] choices)
        lines.append(f"| `{cell}` | {_md(' '.join(help_text.split()))} |")
    return lines + [""]


def _records(command, ctx) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    arguments, options = [], []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:  # hidden
            continue
        (options if param.param_type_name == "option" else arguments).append((record[0], record[1] or ""))
    return arguments, options


def render() -> str:
    import typer

    from backendgen.cli.app import app

    group = typer.main.get_command(app)
    context_class = type(group).context_class
    root_ctx = context_class(group, info_name="backendgen")
    out = [
        "# Command-line reference",
        "",
        f"Generated from the typer app in `backendgen/cli/app.py` by `{REGENERATE}`; do not edit by hand",
        "(`tests/test_clidoc.py` fails when this file and the app differ). `backendgen COMMAND --help`",
        "prints the same text. Exit codes: 0 ok, 1 build, test or check failure, 2 bad input or environment.",
        "",
        "```",
        group.get_usage(root_ctx).strip(),
        "```",
        "",
        _paragraphs(group.help or ""),
        "",
    ]
    _, options = _records(group, root_ctx)
    out += _table("Options", options)
    out += ["| command | summary |", "|---|---|"]
    names = list(group.commands)
    for name in names:
        cmd = group.commands[name]
        out.append(f"| [`{name}`](#backendgen-{name}) | {_md(cmd.get_short_help_str(limit=200))} |")
    out.append("")
    for name in names:
        out += _command(group.commands[name], [name], root_ctx, context_class)
    return "\n".join(out).rstrip() + "\n"


def _command(cmd, path: list[str], parent_ctx, context_class) -> list[str]:
    """One command's section; a group of subcommands (`amp`) is followed by a section per subcommand."""
    ctx = context_class(cmd, info_name=path[-1], parent=parent_ctx)
    out = [
        f"{'#' * (1 + len(path))} backendgen {' '.join(path)}",
        "",
        "```",
        cmd.get_usage(ctx).strip(),
        "```",
        "",
        _paragraphs(cmd.help or ""),
        "",
    ]
    arguments, options = _records(cmd, ctx)
    out += _table("Arguments", arguments)
    out += _table("Options", options)
    for sub in getattr(cmd, "commands", {}):
        out += _command(cmd.commands[sub], [*path, sub], ctx, context_class)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backendgen.cli.clidoc", description="Render docs/cli.md from the CLI.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {DOC}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {DOC} is not what --write would write")
    opts = p.parse_args(argv)
    if (opts.write or opts.check) and not ((ROOT / "docs").is_dir() and (ROOT / "pyproject.toml").is_file()):
        print(
            f"error: {ROOT} is not a backendgen source checkout (installed from a wheel?): --write and --check "
            "work in a clone",
            file=sys.stderr,
        )
        return 2
    text = render()
    if opts.write:
        DOC.write_text(text)
        print(f"wrote {DOC}")
        return 0
    if opts.check:
        current = DOC.read_text() if DOC.is_file() else ""
        if current == text:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(DOC), "rendered")
        )
        print(f"{DOC} is out of date: {REGENERATE}")
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
