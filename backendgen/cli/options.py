"""The options several commands share, declared once: a command takes one as its parameter's type,
`project: ProjectOption = None`. An option whose help differs from command to command (`--no-test`
says which tests, `--json` what the report holds) is declared in its command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ProjectOption = Annotated[
    Path | None, typer.Option("--project", "-p", help="Project directory [default: the one containing .].")
]
NoBuildOption = Annotated[bool, typer.Option("--no-build", help="Write files only.")]
KeepOnFailureOption = Annotated[
    bool, typer.Option("--keep-on-failure", help="Keep the written files if the build or the tests fail.")
]
