"""The jinja environment every operator kind renders its files with (the template's `ops/` folder),
and the naming helpers their templates share."""

from __future__ import annotations

import functools
from pathlib import Path


def environment(ops_dir: Path | None = None):
    """The jinja environment of the kernel templates: the installed template's `ops/`, or `ops_dir`
    (an earlier template's, for backendgen update's base of a kernel file)."""
    from backendgen.project.manifest import template_dir

    return _environment_for(Path(ops_dir) if ops_dir is not None else template_dir() / "ops")


@functools.lru_cache(maxsize=4)
def _environment_for(directory: Path):
    import jinja2

    from backendgen.project.render import bytecode_cache

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=bytecode_cache(),
    )


def camel(name: str) -> str:
    """The C++ class name of an autograd Function for `name`: `my_op` -> `MyOpFunction`."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p) + "Function"
