"""docs/porting.md is the porting guide every generated project has (the template's
`docs/porting.md`), rendered for the docs' example device, `mychip`: one source, two places.
tests/test_port_kit.py fails when they differ; `python -m backendgen.project.portdoc --write`
writes it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from backendgen.project import naming
from backendgen.project.manifest import template_dir

DEVICE = "mychip"  # the device every doc of this repository names (tests/test_docs.py)
SOURCE = Path("{{cookiecutter.dist_name}}") / "docs" / "porting.md"  # in the template directory
DOC = Path(__file__).resolve().parents[2] / "docs" / "porting.md"
REGENERATE = "python -m backendgen.project.portdoc --write"


def render(device: str = DEVICE, template: Path | None = None, driver: str = "emulator") -> str:
    """The template's porting guide as `backendgen new DEVICE [--driver DRIVER]` renders it."""
    from cookiecutter.environment import StrictEnvironment

    text = ((template or template_dir()) / SOURCE).read_text()
    context = {"cookiecutter": {**naming.derive(device).context(), "driver": driver}}
    return StrictEnvironment(context=context, keep_trailing_newline=True).from_string(text).render(**context)


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(f"usage: {REGENERATE}", file=sys.stderr)
        return 2
    DOC.write_text(render())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
