"""docs/cli.md is the CLI reference rendered from the typer app; it must not drift from it."""

from __future__ import annotations

import re

import pytest
import typer
from conftest import run_cli

from backendgen.cli import clidoc
from backendgen.cli.app import app


def test_docs_cli_md_is_what_the_app_renders():
    current = clidoc.DOC.read_text() if clidoc.DOC.is_file() else ""
    if current != clidoc.render():
        pytest.fail(f"docs/cli.md is out of date with backendgen/cli/app.py; regenerate it: {clidoc.REGENERATE}")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## backendgen (\S+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_and_option_of_help_is_in_the_reference():
    """Read back from each command's real `--help`: every option it lists is in that command's section."""
    doc = _sections(clidoc.render())
    commands = list(typer.main.get_command(app).commands)
    assert list(doc) == commands
    for name in commands:
        helped = run_cli(name, "--help", env={"COLUMNS": "200"})
        assert helped.returncode == 0, helped.stderr
        options = set(re.findall(r"^\s+((?:-\w, )?--[\w-]+|-\w)\b", helped.stdout, re.M))
        assert options, helped.stdout
        for opt in options:
            assert f"| `{opt}" in doc[name], f"backendgen {name}: {opt} is missing from the reference"
        first_line = " ".join(helped.stdout.split("\n\n")[1].split())  # the help's first paragraph
        assert first_line[:60] in " ".join(doc[name].split()), name


def test_check_reports_drift_with_the_regeneration_command(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "cli.md"
    stale.write_text(clidoc.render().replace("--dry-run", "--dry-runn"))
    monkeypatch.setattr(clidoc, "DOC", stale)
    assert clidoc.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "-| `--dry-runn` |" in out and clidoc.REGENERATE in out
    assert clidoc.main(["--write"]) == 0
    assert clidoc.main(["--check"]) == 0
    assert stale.read_text() == clidoc.render()


def test_table_cells_keep_code_and_escape_markup():
    assert clidoc._md("a | b <path> `x <y>`") == "a \\| b &lt;path&gt; `x <y>`"
