"""`backendgen ops`: which operators are native, fall back to the CPU, or run a composite, in a project
or in a new project of the current template."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from backendgen.plumbing.errors import NotAProjectError
from backendgen.project import manifest
from backendgen.project.on_disk import Project
from backendgen.torchdb.opdb import load_opdb


@dataclass
class OpStatus:
    name: str
    status: str  # native | fallback | default | composite | no CPU kernel
    core: bool
    schema: str


def list_ops(pattern: str | None = None, project_dir: Path | None = None, *, required: bool = False) -> list[OpStatus]:
    project = None
    if project_dir is not None:
        project = Project.load(Path(project_dir))
    else:
        try:
            project = Project.find()
        except NotAProjectError:  # a broken backendgen.json is an error, not "outside a project"
            project = None
    db = load_opdb()
    pat = (pattern or "*").removeprefix("aten::")
    if not any(ch in pat for ch in "*?["):
        pat = f"*{pat}*"
    # outside a project: what a new project from the current template has natively
    template = manifest.load() if project is None else None
    rows = []
    for op in db.all():
        if not fnmatch.fnmatchcase(op.name, pat):
            continue
        if required and not op.needs_backend_kernel:
            continue
        if (
            project.covering(op.qualified) is not None
            if project is not None
            else template.registering(op.qualified) is not None
        ):
            status = "native"
        elif op.structured_delegate or {"CPU", "CompositeExplicitAutograd"} <= set(op.dispatch_keys):
            status = "fallback"  # registered to the fallback by name (registration.fallback_registrations)
        elif op.composite_implicit:
            status = "composite"
        elif op.lacks_cpu_kernel:
            status = "no CPU kernel"  # the fallback has nothing to run (CUDA-only, sparse-only, ...)
        elif op.needs_backend_kernel:
            status = "fallback"
        else:
            status = "default"
        rows.append(OpStatus(op.qualified, status, "core" in op.tags, op.qualified_schema))
    rows.sort(key=lambda r: (not r.core, r.name))
    return rows
