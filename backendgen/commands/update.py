"""`backendgen update`: what changes carry a project from its template to the current one, and
(with `--torch`) to the installed torch's operator signatures.

Everything here plans; `api.update_project` locks the project, applies the plan in one
`Transaction`, builds and tests. The plan is a set of whole-file texts (`Plan.writes`), so a dry
run prints exactly the diff a real run writes.

Three renders take part, all with the project's own answers (device, package, number of devices,
torch), so every name lines up:

- base: the exact template state the project was generated from (backendgen.project.history keeps every
  state of every earlier version; backendgen.project.template_states renders them and chooses): the
  one backendgen.json records as `template_state`, or, for a project made before that was recorded,
  the state of its version whose rendering matches the most of the project's own files, so a file
  the team never edited is its base and never conflicts;
- ours: the project as it is, with the team's edits;
- theirs: the current template.

Files of the template are merged 3-way (backendgen.project.merge), so a hand edit is never lost (a file
that is not UTF-8 text is compared and replaced as bytes, never merged); a
conflict is left with markers and listed, and the command exits 1 until it is resolved (the
conflicting files are recorded in backendgen.json, `update.conflicts`, and a later `update`
refuses to go on while they still hold markers). Tool-owned files, written from backendgen.json,
are rewritten (tool_owned()). Kernel files add-op wrote are regenerated when unedited (their recorded
hash matches) and merged otherwise, with the older kernel shape as the base.
"""

from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from backendgen import __version__
from backendgen.commands import transaction
from backendgen.commands.transaction import check_no_other_backend
from backendgen.kinds import registration, registry
from backendgen.kinds.aten_kernel import kernel_files
from backendgen.plumbing import git
from backendgen.plumbing.errors import ProjectError
from backendgen.plumbing.files import sha256_text
from backendgen.plumbing.progress import Reporter
from backendgen.plumbing.textenum import TextEnum
from backendgen.project import history, manifest, template_tree
from backendgen.project.history import current_version, template_of
from backendgen.project.merge import has_markers, merge3
from backendgen.project.on_disk import METADATA_FILE, Project
from backendgen.project.record import OpRecord, TorchTarget, UpdateState
from backendgen.project.template_states import (
    answers,
    choose_base,
    earlier_state_of_current,
    render_files,
    template_dir,
    tool_owned,
)
from backendgen.toolchain import build
from backendgen.torchdb.drift import Drift, argument_names, classify
from backendgen.torchdb.opdb import Op, OpDB, load_opdb


class Action(TextEnum):
    """What the update did to one file (shown before its path)."""

    UPDATED = "updated"  # the template's change, applied (you had not edited it)
    MERGED = "merged"  # the template's change merged with your edits
    ADDED = "added"  # new in the template
    REMOVED = "removed"  # removed by the template (you had not edited it)
    KEPT = "kept"  # removed by the template but edited by you: kept
    DELETED = "deleted"  # deleted by you and changed by the template: left deleted
    CONFLICT = "conflict"  # your edit and the template's overlap: resolve the conflict markers
    REWRITTEN = "rewritten"  # written by backendgen from backendgen.json
    REGENERATED = "regenerated"  # a kernel add-op wrote, unedited: written by the current add-op
    SIGNATURE = "signature"  # kernel signature line(s) changed to the installed torch's (--torch)


@dataclass
class FileChange:
    path: str
    action: Action
    note: str = ""


class Fix(TextEnum):
    """What `--torch` did about one operator (shown before the line that says how)."""

    SIGNATURE = "signature"  # the kernel's signature line rewritten
    REGENERATED = "regenerated"  # an unedited kernel written by the current add-op
    RECORDED = "recorded"  # only backendgen.json's names changed
    UNFIXABLE = "unfixable"  # left for the team to port


@dataclass
class TorchFix:
    """What `--torch` did about one recorded operator whose signature changed, or could not do."""

    op: str
    file: str
    action: Fix
    detail: str = ""
    close_matches: list[str] = field(default_factory=list)


@dataclass
class UpdateResult:
    root: Path
    from_version: int
    to_version: int
    dry_run: bool = False
    changes: list[FileChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diff: str = ""  # the unified diff of the plan (always computed; printed by --dry-run)
    torch: list[TorchFix] | None = None  # with --torch
    torch_recorded: str | None = None  # the torch version now recorded (--torch, nothing left unfixable)
    check: object | None = None  # check.CheckReport, with --torch
    unresolved: list[str] = field(default_factory=list)  # files of an earlier update still holding markers
    built: bool = False
    tested: bool = False

    @property
    def conflicts(self) -> list[str]:
        return [c.path for c in self.changes if c.action is Action.CONFLICT] + self.unresolved

    @property
    def unfixable(self) -> list[TorchFix]:
        return [f for f in (self.torch or []) if f.action is Fix.UNFIXABLE]

    @property
    def exit_code(self) -> int:
        bad_check = self.check is not None and self.check.exit_code != 0
        return 1 if self.conflicts or self.unfixable or bad_check else 0


class Plan:
    """Whole files to write (None: delete), over the project as it is on disk: text, or bytes for a
    file that is not UTF-8 (template_tree.text_or_bytes)."""

    def __init__(self, root: Path):
        self.root = root
        self.writes: dict[str, str | bytes | None] = {}
        self.modes: dict[str, int] = {}  # for files that do not exist yet

    def original(self, rel: str) -> str | bytes | None:
        path = self.root / rel
        if not path.is_file():
            return None
        return template_tree.text_or_bytes(path.read_bytes())

    def read(self, rel: str) -> str | bytes | None:
        return self.writes[rel] if rel in self.writes else self.original(rel)

    def write(self, rel: str, text: str | bytes | None, mode: int | None = None) -> None:
        if text == self.original(rel):
            self.writes.pop(rel, None)
        else:
            self.writes[rel] = text
            if mode is not None:
                self.modes[rel] = mode

    def diff(self) -> str:
        out = []
        for rel in sorted(self.writes):
            old, new = self.original(rel), self.writes[rel]
            if isinstance(old, bytes) or isinstance(new, bytes):
                out.append(
                    f"Binary files {'a/' + rel if old is not None else '/dev/null'} and "
                    f"{'b/' + rel if new is not None else '/dev/null'} differ\n"
                )
                continue
            out += difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{rel}" if old is not None else "/dev/null",
                tofile=f"b/{rel}" if new is not None else "/dev/null",
            )
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


# --- checks before anything is planned -----------------------------------------------------------


def recorded_version(project: Project) -> int:
    raw = project.record.template_version or "1"  # template-1 projects of the first releases lack it
    try:
        version = int(str(raw))
    except ValueError:
        version = 0
    current = current_version()
    if version < 1:
        raise ProjectError(
            f"{project.metadata_path} records an unknown template version {raw!r}; restore it from version control"
        )
    if version > current:
        raise ProjectError(
            f"the project is on template {version} but this backendgen's template is {current}; upgrade backendgen"
        )
    return version


def pending_conflicts(project: Project) -> list[str]:
    """Files an earlier update left with conflict markers that still hold them."""
    recorded = project.record.update.conflicts if project.record.update else []
    still = []
    for rel in recorded:
        path = project.root / rel
        try:
            if path.is_file() and has_markers(path.read_text(errors="replace")):
                still.append(rel)
        except OSError:
            continue
    return still


# --- the template -----------------------------------------------------------------------------------


def plan_template(project: Project, plan: Plan, result: UpdateResult, *, old: int, old_dir: Path) -> None:
    """Merge every file of the template, base (template `old`, rendered from `old_dir`: the state
    choose_base picked) -> theirs (the current template), into the project."""
    new = result.to_version
    labels = ("yours", f"template {old}", f"template {new}")
    with tempfile.TemporaryDirectory(prefix="backendgen-update-") as tmp:
        base = render_files(
            old_dir, answers(project, old, (project.record.backendgen_version or __version__)), Path(tmp) / "base"
        )
        with template_of(new) as new_dir:
            theirs = render_files(new_dir, answers(project, new, __version__), Path(tmp) / "theirs")
    skip = set(tool_owned())
    for rel in sorted(set(base) | set(theirs)):
        if rel in skip:
            continue
        b = base.get(rel, (None, 0))[0]
        t, mode = theirs.get(rel, (None, 0o644))
        merge_file(plan, result, rel, b, t, labels, mode=mode)


def merge_file(
    plan: Plan,
    result: UpdateResult,
    rel: str,
    base: str | bytes | None,
    theirs: str | bytes | None,
    labels: tuple[str, str, str],
    *,
    mode: int | None = None,
    regenerated: bool = False,
) -> None:
    """Plan one file: base -> theirs merged into the project's text (None: no such file). A file
    that is bytes on any side is never merged: the template's replaces the project's only if the
    project's is the base's."""
    ours = plan.read(rel)
    if base == theirs and not regenerated:
        return  # the template did not change it: the project's file, edited or not, stays as it is
    if theirs is None:  # the template removed it
        if ours is None:
            return
        if ours == base:
            plan.write(rel, None)
            result.changes.append(FileChange(rel, Action.REMOVED))
        else:
            result.changes.append(FileChange(rel, Action.KEPT, "the new template has no such file; yours is kept"))
        return
    if ours is None:
        if base is None:
            plan.write(rel, theirs, mode)
            result.changes.append(FileChange(rel, Action.ADDED))
        else:
            result.changes.append(FileChange(rel, Action.DELETED, "you deleted it; the new template changed it"))
        return
    if ours == theirs:
        return
    if ours == base:
        plan.write(rel, theirs)
        result.changes.append(FileChange(rel, Action.REGENERATED if regenerated else Action.UPDATED))
        return
    if any(isinstance(x, bytes) for x in (base, ours, theirs)):
        result.changes.append(
            FileChange(
                rel,
                Action.KEPT,
                "not text, changed by you and by the template: yours is kept; take the template's change by hand",
            )
        )
        return
    merged = merge3(base or "", ours, theirs, labels=labels)
    plan.write(rel, merged.text)
    if merged.conflicts:
        what = (
            "the project already has a different file there"
            if base is None
            else f"{merged.conflicts} conflicting region(s)"
        )
        result.changes.append(FileChange(rel, Action.CONFLICT, what))
    elif merged.text != ours:
        result.changes.append(FileChange(rel, Action.MERGED))


# --- kernels add-op wrote -----------------------------------------------------------------------------

# --- --torch ------------------------------------------------------------------------------------------


def plan_torch(project: Project, db: OpDB, plan: Plan, result: UpdateResult) -> set[str]:
    """Re-derive every recorded operator's signature from the installed torch. Where only types
    changed, rewrite the kernel's signature line(s) (the static_assert names the dispatcher's type, so
    it follows by itself) — or the whole file if add-op's text is unedited; where only names
    changed, update the record (as check --accept does). Everything else is listed as unfixable.
    Returns the kernel files it could not fix (the kernel kind's carry leaves them alone)."""
    fixes: list[TorchFix] = []
    files = kernel_files(project)
    for rec in project.ops:
        op = db.get(rec.op)
        kind = classify(
            rec.signature,
            op,
            schema_unchanged=op is not None and (rec.schema, rec.signature) == (op.qualified_schema, op.signature),
        )
        if kind is not Drift.UNCHANGED:
            fixes.append(_torch_fix(project, db, plan, result, rec, op, kind, files))
    result.torch = fixes
    return {f.file for f in fixes if f.action is Fix.UNFIXABLE}  # the template step leaves these alone


def _torch_fix(
    project: Project,
    db: OpDB,
    plan: Plan,
    result: UpdateResult,
    rec: OpRecord,
    op: Op | None,
    kind: Drift,
    files: dict[str, list[OpRecord]],
) -> TorchFix:
    """What --torch does about one recorded operator the installed torch changed (`kind`)."""
    where = rec.source or manifest.load().path("template_kernels")
    if kind is Drift.REMOVED:
        return TorchFix(
            rec.op,
            where,
            Fix.UNFIXABLE,
            f"removed from torch {db.torch_version}: port the kernel or backendgen remove-op {rec.op}",
            close_matches=db.close_matches(rec.op),
        )
    if kind is Drift.SCHEMA_CHANGED:
        rec.schema, rec.signature = op.qualified_schema, op.signature
        if rec.overloads:
            rec.overloads = [o.qualified for o in db.overloads(op.base)]
        project.add_op(rec)
        return TorchFix(rec.op, where, Fix.RECORDED, "schema changed, C++ types the same: record updated")
    if rec.origin != "add-op":
        return TorchFix(
            rec.op, where, Fix.UNFIXABLE, f"its kernel is part of the template ({where}): change it to {op.signature}"
        )
    return _fix_signature(project, plan, result, rec, op, files.get(rec.source, [rec]))


def _fix_signature(
    project: Project, plan: Plan, result: UpdateResult, rec: OpRecord, op: Op, recs: list[OpRecord]
) -> TorchFix:
    """A kernel add-op wrote whose C++ signature changed: regenerated if unedited, else its signature
    line rewritten where only the types changed; `recs`: the records of the kernel's file."""
    text = plan.read(rec.source)
    text = None if isinstance(text, bytes) else text  # not text: listed as unfixable below
    if text is not None and recs[0].source_sha256 and sha256_text(text) == recs[0].source_sha256:
        # unedited: the kernel kind's carry rewrites the whole file for the new torch
        return TorchFix(rec.op, rec.source, Fix.REGENERATED, f"{rec.signature} -> {op.signature}")
    if argument_names(op.signature) != argument_names(rec.signature):
        return TorchFix(
            rec.op,
            rec.source,
            Fix.UNFIXABLE,
            f"arguments changed: {rec.signature} -> {op.signature}; edit the kernel to the new signature",
        )
    line = f"{rec.signature} {{"
    if text is None or text.count(line) != 1:
        return TorchFix(
            rec.op,
            rec.source,
            Fix.UNFIXABLE,
            f"the line `{line}` is not in the file (once); change it to {op.signature}",
        )
    plan.write(rec.source, text.replace(line, f"{op.signature} {{"))
    rec.schema, rec.signature = op.qualified_schema, op.signature
    project.add_op(rec)
    result.changes.append(FileChange(rec.source, Action.SIGNATURE, rec.op))
    return TorchFix(rec.op, rec.source, Fix.SIGNATURE, f"{line[:-2]} -> {op.signature}")


# --- the command -------------------------------------------------------------------------------


def update_project(
    project_dir: Path | None = None,
    *,
    dry_run: bool = False,
    torch_signatures: bool = False,
    build_it: bool = True,
    test_it: bool = True,
    allow_dirty: bool = False,
    keep_on_failure: bool = False,
    reporter: Reporter | None = None,
) -> UpdateResult:
    """Carry a project to the current template: tool-owned files rewritten, the others merged 3-way so
    no hand edit is lost, add-op's kernels brought to the current kernel shape. With
    `torch_signatures`, first re-derive every recorded operator's signature from the installed torch
    and fix the kernels where only types changed; then check.

    One transaction (commands.transaction): a failure or an interrupt puts every file back. Conflicts
    are left with markers, listed in the result (exit_code 1) and recorded; nothing is built then. A
    project in a git work tree with uncommitted changes is refused unless `allow_dirty`. `dry_run`: the
    result's diff says what would change, nothing is written."""
    from backendgen.commands.check import check_project

    rep = reporter or Reporter()
    project = Project.of(project_dir)
    result = UpdateResult(project.root, recorded_version(project), current_version(), dry_run=dry_run)
    kept = "the updated files were kept (--keep-on-failure); git diff shows them"
    with transaction.change(project, keep_on_failure=keep_on_failure, kept=kept) as change:
        if not dry_run and not allow_dirty:
            dirty = git.dirty_files(project.root)
            if dirty:
                more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
                raise ProjectError(
                    f"{project.root} has uncommitted changes ({dirty[0]}{more}); commit or stash them, "
                    "or pass --allow-dirty"
                )
        with rep.step("plan"):
            result.unresolved = pending_conflicts(project)
            if result.unresolved:
                return result  # an earlier update's conflicts first
            plan = _plan_update(project, result, torch_signatures=torch_signatures)
        if not dry_run and plan.writes:
            build_it = build_it and not result.conflicts and not result.unfixable  # nothing to build until resolved
            if build_it:  # before anything is written
                build.check_toolchain()
                check_no_other_backend(project.dist_name)
                if test_it:
                    build.check_test_tools()
            with change.writing(rep) as tx:
                for rel, text in plan.writes.items():
                    if text is None:
                        tx.remove(project.root / rel)
                    else:
                        tx.write(project.root / rel, text)
                        if rel in plan.modes:
                            (project.root / rel).chmod(plan.modes[rel])
            if build_it:
                # through pip: the template may have changed setup.py, pyproject.toml or the packages
                change.build_and_test(rep, incremental=False, test=test_it)
                result.built, result.tested = change.built, change.tested
    if torch_signatures and not dry_run:
        with rep.step("check"):
            result.check = check_project(Project.load(project.root))
    return result


@dataclass
class _Step:
    """The update's plan as the operator kinds see it (kinds.kind.UpdateStep)."""

    plan: Plan
    result: UpdateResult
    old: int
    new: int
    old_dir: Path | None
    old_torch: str
    skip: set[str]
    moves: bool

    def read(self, rel: str) -> str | bytes | None:
        return self.plan.read(rel)

    def merge(self, rel: str, base, theirs, *, regenerated: bool = False) -> None:
        labels = ("yours", f"template {self.old}", f"template {self.new}")
        merge_file(self.plan, self.result, rel, base, theirs, labels, regenerated=regenerated)

    def add(self, rel: str, text: str, why: str = "") -> None:
        self.plan.write(rel, text)
        self.result.changes.append(FileChange(rel, Action.ADDED, why))

    def note(self, text: str) -> None:
        self.result.notes.append(text)


def _plan_update(project: Project, result: UpdateResult, *, torch_signatures: bool) -> Plan:
    """Every file the update writes (`Plan.writes`) and what the result reports of it; project's record
    is brought up to date in memory."""
    old, new = result.from_version, result.to_version
    db = load_opdb()
    if db.torch_version != project.torch_version and not torch_signatures:
        raise ProjectError(
            f"the project targets torch {project.torch_version} but torch {db.torch_version} is installed; "
            "pass --torch to move it to the installed torch too (or install the project's torch)"
        )
    registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
    plan = Plan(project.root)
    old_torch = project.torch_version
    skip = plan_torch(project, db, plan, result) if torch_signatures else set()
    # a project from an earlier state of the current template merges like one from an earlier version
    moves = old < new or earlier_state_of_current(project) is not None
    if moves or torch_signatures:
        base = choose_base(project, old)
        if old < new or base.state is not None:
            result.notes.append(f"merge base: {base.how}")
        with template_dir(base) as old_dir:
            if moves:
                plan_template(project, plan, result, old=old, old_dir=old_dir)
                project.record.template_version = str(new)
                project.record.backendgen_version = __version__
                project.record.template_state = history.current_state()
            step = _Step(plan, result, old=old, new=new, old_dir=old_dir, old_torch=old_torch, skip=skip, moves=moves)
            for kind in registry.KINDS:  # each kind of operator carries its own files and records
                kind.carry(project, db, step)
    if torch_signatures and not result.unfixable:
        project.record.torch = TorchTarget(version=db.torch_version, native_functions_sha256=db.yaml_sha256)
        result.torch_recorded = db.torch_version
    if result.conflicts:
        project.record.update = UpdateState(from_=old, to=new, conflicts=sorted(set(result.conflicts)))
    else:
        project.record.update = None
    # the current template's registration files (the project records its version now): update writes them
    for rel, text in (*registration.files(project, db).items(), (METADATA_FILE, project.metadata_text())):
        plan.write(rel, text)
        if rel in plan.writes:
            result.changes.append(FileChange(rel, Action.REWRITTEN))
    result.diff = plan.diff()
    return plan
