"""How `backendgen update` carries the kernels add-op wrote to the current template and torch (the
ATen kernel kind's `carry`, kinds.aten_kernel).

- `carry_kernels`: every kernel file add-op wrote (its test, the test harness) brought to the current
  kernel shape: an unedited file is rewritten, an edited one merged 3-way with the shape add-op first
  wrote as base (from the project's git history, or rendered again);
- `refresh_template_records`: the records of the operators the current template registers itself;
- `add_default_kernels`: the kernels a fresh project of the current template has that the project lacks.

The update's plan of whole-file writes is reached through `step` (kinds.kind.UpdateStep), so this
module does not depend on the command that drives it.
"""

from __future__ import annotations

import contextlib
import difflib
import shutil
import subprocess
from pathlib import Path

from backendgen.kinds import kernelgen
from backendgen.kinds.aten_kernel import kernel_paths, kernel_records, template_record
from backendgen.kinds.kind import UpdateStep
from backendgen.plumbing.files import sha256_text
from backendgen.project import contract, manifest
from backendgen.project.on_disk import Project
from backendgen.project.record import OpRecord
from backendgen.torchdb.opdb import OpDB


def kernel_files(project: Project) -> dict[str, list[OpRecord]]:
    files: dict[str, list[OpRecord]] = {}
    for rec in project.ops:
        if rec.origin == "add-op" and rec.source:
            files.setdefault(rec.source, []).append(rec)
    return files


def _try_render(fn, *args, **kwargs) -> str | None:
    import jinja2

    try:
        return fn(*args, **kwargs)
    except jinja2.TemplateError:
        return None  # an older kernel template that wants what the current kernelgen no longer passes


def carry_kernels(project: Project, db: OpDB, step: UpdateStep) -> None:
    """Bring every kernel file add-op wrote (and its test, and the test harness) to the current
    kernel shape: unedited files are rewritten, edited ones merged with the older shape as base.
    The records of each file are replaced by the current add-op's (a template-1 structured kernel
    gains its functional kernel). `step.old_dir`: the older template (None: the current one)."""
    old_ops = step.old_dir / "ops" if step.old_dir is not None else None
    harness = project.paths["kernel_harness"]
    for source, recs in kernel_files(project).items():
        if source in step.skip:
            continue
        requested = recs[0].requested or recs[0].op
        op = db.get(requested)
        if op is None:
            step.note(f"{source}: {requested} is not in the installed torch; left as it is (backendgen check)")
            continue
        new_plan = kernelgen.plan_kernel(db, op)
        if kernel_paths(new_plan, project)[0] != source:
            step.note(f"{source}: the current add-op writes {requested}'s kernel elsewhere; left as it is")
            continue
        test = kernel_paths(new_plan, project)[1]
        ours = step.read(source)
        if ours is None:
            step.note(f"{source} is recorded but missing; left missing (backendgen remove-op {requested})")
            continue
        if isinstance(ours, bytes):
            step.note(f"{source} is not UTF-8 text; left as it is")
            continue
        theirs = kernelgen.render_kernel(
            new_plan, device=project.device, source_path=source, torch_version=db.torch_version
        )
        recorded = recs[0].source_sha256
        base_plan = kernelgen.plan_kernel(db, op, features=manifest.load().features_of(step.old))
        base, exact = kernel_base(
            project, db, op, source, ours, recorded, old=step.old, old_ops=old_ops, old_torch=step.old_torch
        )
        unedited = recorded is not None and sha256_text(ours) == recorded
        if unedited:
            step.merge(source, ours, theirs, regenerated=True)
        else:
            if not exact:
                step.note(
                    f"{source}: the kernel add-op first wrote could not be rebuilt exactly; "
                    "merged against its closest shape (read the merge)"
                )
            step.merge(source, base, theirs)
        # the test add-op wrote beside it
        if (project.root / test).exists() or step.read(test) is not None:
            base_test = _try_render(
                kernelgen.render_test, base_plan, device=project.device, source_path=source, ops_dir=old_ops
            ) or kernelgen.render_test(base_plan, device=project.device, source_path=source)
            step.merge(test, base_test, kernelgen.render_test(new_plan, device=project.device, source_path=source))
        for rec in recs:
            project.remove_op(rec.op)
        for rec in kernel_records(project, db, new_plan, source_sha256=sha256_text(theirs)):
            project.add_op(rec)
    if step.read(harness) is not None:
        registration_file = project.paths["registration"]
        new_harness = kernelgen.render_harness(device=project.device, registration_file=registration_file)
        old_harness = (
            _try_render(
                kernelgen.render_harness, device=project.device, registration_file=registration_file, ops_dir=old_ops
            )
            or new_harness
        )
        step.merge(harness, old_harness, new_harness)


def add_default_kernels(project: Project, db: OpDB, step: UpdateStep) -> None:
    """Add the kernels a fresh project of the current template has that `project` lacks: the
    manifest's `default_ops` and the derived view kernels (`kernelgen.view_ops_needing_kernels`), as
    `backendgen new` writes them, so the current template's tests (a first model, every view
    operator without the CPU fallback) hold for an updated project too. An operator the project
    already makes native (an add-op record, or an `m.impl` at PrivateUse1 in one of its own C++
    files: two registrations abort the load) or whose kernel path is taken is left out, with a note."""
    tpl = manifest.load()
    views, _ = kernelgen.view_ops_needing_kernels(db, tpl.builtin_ops())
    own: set[str] = set()
    for path in sorted((project.root / "csrc").rglob("*.cpp")):
        if path.relative_to(project.root).as_posix() != project.paths["registration"]:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                own |= contract.registrations(path.read_text())[0].get("PrivateUse1", set())
    added = False
    for name in dict.fromkeys([*tpl.default_ops, *views]):
        op = db.get(name)
        if op is None:
            continue
        new_plan = kernelgen.plan_kernel(db, op)
        if any(project.find_op(q) is not None for q in new_plan.covers):
            continue  # native already (add-op, or an earlier update)
        mine = sorted(q for q in new_plan.covers if q in own)
        source, test = kernel_paths(new_plan, project)
        if mine:
            step.note(f"{op.qualified}: not added, your C++ registers {', '.join(mine)} at PrivateUse1")
            continue
        if step.read(source) is not None or step.read(test) is not None:
            step.note(f"{op.qualified}: not added, {source} or {test} exists (backendgen add-op {op.qualified})")
            continue
        text = kernelgen.render_kernel(
            new_plan, device=project.device, source_path=source, torch_version=db.torch_version
        )
        for rel, body in (
            (source, text),
            (test, kernelgen.render_test(new_plan, device=project.device, source_path=source)),
        ):
            step.add(rel, body, f"a default kernel of template {step.new}")
        for rec in kernel_records(project, db, new_plan, source_sha256=sha256_text(text)):
            project.add_op(rec)
        added = True
    if added:
        harness = kernelgen.render_harness(device=project.device, registration_file=project.paths["registration"])
        for rel, text in (
            (f"{project.paths['kernel_tests']}/__init__.py", ""),
            (project.paths["kernel_harness"], harness),
        ):
            if step.read(rel) is None:
                step.add(rel, text)


def kernel_base(
    project: Project,
    db: OpDB,
    op,
    source: str,
    ours: str,
    recorded: str | None,
    *,
    old: int,
    old_ops: Path | None,
    old_torch: str,
) -> tuple[str, bool]:
    """The kernel file as add-op wrote it, for the 3-way merge, and whether it is exactly that (its
    hash is the recorded one). Looked for in the project's git history first, then rendered by the
    current kernelgen in the older template's kernel shape (and variants: kernelgen itself has
    changed between releases); without an exact one, the rendering closest to the project's file."""
    if recorded:
        for text in git_versions(project.root, source):
            if sha256_text(text) == recorded:
                return text, True
    candidates = []
    tpl = manifest.load()
    for features in dict.fromkeys((tpl.features_of(old), tpl.current_features, tpl.features_of(1))):
        plan = kernelgen.plan_kernel(db, op, features=features)
        for ops_dir in (old_ops, None):
            text = _try_render(
                kernelgen.render_kernel,
                plan,
                device=project.device,
                source_path=source,
                torch_version=old_torch,
                ops_dir=ops_dir,
            )
            if text is not None:
                if recorded and sha256_text(text) == recorded:
                    return text, True
                candidates.append(text)
    ours_lines = ours.splitlines()
    closest = max(
        candidates, key=lambda c: difflib.SequenceMatcher(None, c.splitlines(), ours_lines, autojunk=False).ratio()
    )
    return closest, False


def git_versions(root: Path, rel: str, limit: int = 50) -> list[str]:
    """The committed versions of `rel` (newest first) if the project is in a git work tree."""
    if shutil.which("git") is None:
        return []
    log = subprocess.run(
        ["git", "-C", str(root), "log", f"-n{limit}", "--format=%H", "--", rel], capture_output=True, text=True
    )
    if log.returncode != 0:
        return []
    out = []
    for commit in log.stdout.split():
        show = subprocess.run(["git", "-C", str(root), "show", f"{commit}:./{rel}"], capture_output=True)
        if show.returncode == 0:
            with contextlib.suppress(UnicodeDecodeError):
                out.append(show.stdout.decode())
    return out


def refresh_template_records(project: Project, db: OpDB) -> None:
    """The records of the operators the current template registers itself (the manifest's
    integration points), and, for a project coming to a template with an autocast table, the
    template's table."""
    tpl = manifest.load()
    if not isinstance(project.record.amp, dict):
        project.record.amp = {n: p for n, p in tpl.default_amp.items() if db.get(n) is not None}
    wanted = []
    for name in tpl.builtin_ops():
        op = db.get(f"aten::{name}") or db.get(name)
        if op is not None:
            wanted.append(op)
    names = {op.qualified for op in wanted}
    for rec in project.ops:
        if rec.origin == "template" and rec.op not in names:
            project.remove_op(rec.op)
    for op in wanted:
        if project.find_op(op.qualified) is None:
            project.add_op(template_record(project, db, op))
