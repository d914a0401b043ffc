"""The device drivers a project can be made with (`backendgen new NAME --driver minimal`).

The template's project tree holds the default driver, the emulator (`csrc/driver/`: `driver.h`, the
port API; the emulator's `driver.cpp` and `streams.cpp` and their internal header). Another driver
is a set of files the template keeps outside the project tree (`template/drivers/<name>/`); the manifest's
`drivers` names each driver's files (`{project path: template path}`, backendgen.project.manifest).
A project made with a driver has that driver's files in place of every driver's files of the tree,
rendered with the same context as the rest: `arrange` lays the template out so, and cookiecutter
renders it as one tree (backendgen.project.render.render_into), so `update` renders a project's
base and the current template with its own driver (the `driver` of `backendgen.json`, absent in
projects made before there was a choice: the emulator). A template state from before a driver
existed cannot render a project with it: `arrange` refuses.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from backendgen.plumbing.errors import UserError
from backendgen.project import manifest, template_tree
from backendgen.project.manifest import EMULATOR, Driver

PROJECT_DIR = "{{cookiecutter.dist_name}}"  # the template's project tree
DEFAULT = EMULATOR

T = TypeVar("T")


def check(name: str, m: manifest.Manifest | None = None) -> str:
    """`name` if the installed template has such a driver; else a one-line UserError naming them."""
    m = m or manifest.load()
    if name not in m.drivers:
        shown = name if len(name) <= 40 else name[:37] + "..."
        raise UserError(f"unknown driver {shown!r}: --driver is one of {', '.join(m.drivers)}")
    return name


def of(data: dict) -> dict[str, Driver]:
    """The drivers of a template whose manifest (its parsed template.json) is `data`."""
    return manifest.drivers_of(data)


def supports(data: dict, driver: str) -> bool:
    """Whether the template whose manifest is `data` can make a project with `driver`."""
    return driver in of(data)


def arrange(files: Mapping[str, T], data: dict, driver: str, *, what: str = "the template") -> dict[str, T]:
    """The template tree cookiecutter renders for a project with `driver`: `files` (template path ->
    anything: a path, a blob's digest) less every driver's files in the project tree, plus `driver`'s
    own at their project paths. `data` is the template's manifest; `what` names the template in an
    error (a state from before `driver` existed cannot render it)."""
    drivers = of(data)
    if driver not in drivers:
        raise UserError(
            f"{what} has no {driver} driver (it predates `backendgen new --driver {driver}`): "
            "it cannot render a project made with it"
        )
    every = {f"{PROJECT_DIR}/{p}" for d in drivers.values() for p in d.files}
    out = {rel: value for rel, value in files.items() if rel not in every}
    for path, source in drivers[driver].files.items():
        if source not in files:
            raise UserError(f"{what} lacks {source}, the {driver} driver's {path}; reinstall backendgen")
        out[f"{PROJECT_DIR}/{path}"] = files[source]
    return out


@contextlib.contextmanager
def arranged(template: Path, data: dict, driver: str) -> Iterator[Path]:
    """The template directory `template`, laid out for `driver` (`arrange`): itself when that changes
    nothing (the default driver), else a copy (removed when the block ends)."""
    listing = {rel: rel for rel in template_tree.paths(template)}
    layout = arrange(listing, data, driver)
    if layout == listing:
        yield template
        return
    with tempfile.TemporaryDirectory(prefix=f"backendgen-{driver}-") as tmp:
        root = Path(tmp) / "template"
        for rel, source in layout.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(template / source, root / rel)
        yield root
