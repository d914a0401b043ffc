"""What `add-op` and `remove-op` do to a project, behind api.add_ops/remove_ops.

Both loop over the operator kinds (backendgen.kinds.registry): each name is claimed by exactly one kind
(an ATen kernel, the backend's own operator, an autograd override), which plans, writes, records and
removes it. The command runs as one transaction (commands.transaction): lock, consistency check, gate
(the torch the project targets, the test tools, a hand-edited registration file), plan, write every
file and the registration file, build with the new tests' process started early, test; a failure or
an interrupt rolls every file back, unless `keep_on_failure` keeps them for a look. `remove` is the
reverse, without a build.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from backendgen.commands import consistency, transaction
from backendgen.kinds import registration, registry
from backendgen.kinds.kind import Planned, Removal, Request
from backendgen.plumbing import faults
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import Project
from backendgen.toolchain import build
from backendgen.torchdb import support
from backendgen.torchdb.opdb import OpDB, load_opdb

# --- gating ----------------------------------------------------------------------------------------


def torch_note(version: str, rep: Reporter) -> str | None:
    """Apply the support policy (backendgen.support): refuse a torch older than the minimum; for one
    that is not a tested release, report a note (once, before the work starts) and return it."""
    note = support.torch_support(version).note
    if note:
        rep.note(note)
    return note


def check_torch(project: Project, db: OpDB) -> None:
    """Refuse to edit a project generated for another torch than the installed one."""
    if db.torch_version != project.torch_version:
        raise ProjectError(
            f"the project was generated for torch {project.torch_version} but torch {db.torch_version} is installed; "
            "run backendgen check and follow docs/upgrading.md first"
        )


def _check_namespaces(names: list[str], device: str) -> None:
    for n in names:
        ns, sep, _ = n.strip().partition("::")
        if sep and ns not in ("aten", device):
            raise UserError(
                f"{n[:80]!r}: add-op defines operators in this backend's namespace ({device}::NAME) "
                "and writes kernels for aten:: operators"
            )


def claimed(names: list[str], device: str, request: Request) -> dict:
    """The names each kind claims, in the registry's order."""
    by_kind = {k: [] for k in registry.KINDS}
    for n in names:
        by_kind[registry.kind_of(n, device, request)].append(n)
    return by_kind


def plan(names: list[str], project: Project, db: OpDB, request: Request) -> list[Planned]:
    """Each kind's plan for `names`; refuses what does not fit together before anything is written."""
    _check_namespaces(names, project.device)
    by_kind = claimed(names, project.device, request)
    for kind, mine in by_kind.items():
        kind.check_request(mine, project, request)
    return [kind.plan(mine, project, db, request) for kind, mine in by_kind.items() if mine]


# --- add-op ----------------------------------------------------------------------------------------


@dataclass
class AddOpsResult:
    root: Path
    added: list[str] = field(default_factory=list)  # qualified ops that got a kernel
    unchanged: list[str] = field(default_factory=list)  # requested ops that were already native
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    built: bool = False
    tested: bool = False
    skipped: list[build.Skipped] = field(default_factory=list)  # what the new tests skipped, and why
    torch_note: str | None = None  # support.Support.note: the installed torch is not a tested one


def add(
    project: Project,
    names: list[str],
    *,
    schema: str | None,
    body: str | None,
    autograd: bool,
    build_it: bool,
    test_it: bool,
    dry_run: bool,
    keep_on_failure: bool,
    rep: Reporter,
) -> AddOpsResult:
    """api.add_ops on a loaded project."""
    result = AddOpsResult(project.root)
    request = Request(schema=schema, body=body, autograd=autograd)
    with transaction.change(project, keep_on_failure=keep_on_failure) as change:
        with rep.step("resolve"):
            db = load_opdb()
            result.torch_note = torch_note(db.torch_version, rep)
            check_torch(project, db)
            plans = plan(names, project, db, request)
            for p in plans:
                result.unchanged += p.unchanged
                result.notes += p.notes
            work = [(p.kind, item) for p in plans for item in p.items]
            if work and build_it and test_it and not dry_run:
                build.check_test_tools()
            rewrite_registration = registration.needs_rewrite(project, db)
        # recorded by an earlier run that was stopped before its build finished: this run builds them
        pending = consistency.unbuilt_records(project, change.state) if build_it and not dry_run else []
        if pending:
            result.unchanged = [
                n
                for n in result.unchanged
                if n not in pending and getattr(project.covering(n), "op", None) not in pending
            ]
            result.added += pending
            result.notes.append(
                f"{', '.join(pending)} {'is' if len(pending) == 1 else 'are'} recorded in backendgen.json "
                "but the library was not built with it since (an earlier run stopped): building now"
            )
        if not work and not rewrite_registration and not pending:
            return result
        if dry_run:
            for kind, item in work:
                result.files += [project.root / f for f in kind.files(item, project)]
                result.added.append(kind.qualified(item))
            result.files += [project.root / f for f in registration.paths(project)]
            return result
        if work or rewrite_registration:
            with change.writing(rep) as tx:
                result.added += [kind.write(item, project, db, tx) for kind, item in work]
                registration.write(project, db, tx)
                change.save_record()
                result.files = change.written
            faults.reached("add-op:written")
        if build_it:
            tests = [t for kind, item in work for t in kind.tests(item, project)] + _tests_of(project, pending)
            change.build_and_test(rep, tests=tests, test=test_it, early=True, name="add-op-test")
            result.built, result.tested = change.built, change.tested
            if change.log is not None:
                result.skipped = build.skipped_tests(change.log)
    return result


def _tests_of(project: Project, ops: list[str]) -> list[str]:
    """The test files recorded for `ops` (of any kind) that exist."""
    tests = [
        t for kind in registry.KINDS for rec in kind.records(project) if rec.op in ops for t in kind.record_tests(rec)
    ]
    return [t for t in dict.fromkeys(tests) if (project.root / t).is_file()]


# --- remove-op -------------------------------------------------------------------------------------


@dataclass
class RemoveOpsResult:
    root: Path
    removed: list[str] = field(default_factory=list)  # qualified ops whose kernel is gone
    files: list[Path] = field(default_factory=list)  # deleted kernel and test files
    backups: list[Path] = field(default_factory=list)  # copies of edited files removed with force


def remove(project: Project, names: list[str], *, force: bool, autograd: bool) -> RemoveOpsResult:
    """api.remove_ops on a loaded project."""
    result = RemoveOpsResult(project.root)
    request = Request(autograd=autograd)
    # a missing file is fine only if it belongs to what is removed: checked once that is known
    with transaction.change(project, require_files=False, rebuilds=False) as change:
        removals: dict[tuple[str, str], Removal] = {}
        for name in names:
            for r in registry.kind_of(name, project.device, request).removals(name, project, request):
                removals.setdefault((r.kind.section, r.source), r)
        change.require_files(ignore=tuple(f for r in removals.values() for f in r.files))
        db = load_opdb()
        registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
        edited = [r.source for r in removals.values() if r.edited]
        if edited and not force:
            raise ProjectError(
                f"{', '.join(edited)} changed since add-op wrote it; pass --force to remove it anyway "
                "(a copy is kept beside it)"
            )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        with change.writing() as tx:
            for r in removals.values():
                for rel in r.files:
                    path = project.root / rel
                    if not path.exists():
                        continue
                    if r.edited:
                        backup = path.with_name(f"{path.name}.removed-{stamp}")
                        tx.touch_file(backup)  # a rollback removes the copy again
                        shutil.copy2(path, backup)
                        result.backups.append(backup)
                    tx.remove(path)
                    result.files.append(path)
                for rec in r.records:
                    r.kind.unrecord(project, rec)
                    result.removed.append(rec.op)
            registration.write(project, db, tx)  # the installed torch's: remove-op is an upgrade step
            change.save_record()
    return result


# --- the commands ----------------------------------------------------------------------------------


def add_ops(
    names: list[str],
    project_dir: Path | None = None,
    *,
    schema: str | None = None,
    body: str | None = None,
    autograd: bool = False,
    build_it: bool = True,
    test_it: bool = True,
    dry_run: bool = False,
    keep_on_failure: bool = False,
    reporter: Reporter | None = None,
) -> AddOpsResult:
    """Give the named ATen operators kernels of the backend's own (and their tests), define the
    backend's own operator `<device>::NAME` (`schema`, `body`, `autograd`), or override the
    derivative of ATen operators (`autograd`); then build and test. One transaction: a failure puts
    every file back unless `keep_on_failure`."""
    if not names:
        raise UserError("name at least one operator, e.g. aten::mul.Tensor")
    project = Project.of(project_dir)
    return add(
        project,
        names,
        schema=schema,
        body=body,
        autograd=autograd,
        build_it=build_it,
        test_it=test_it,
        dry_run=dry_run,
        keep_on_failure=keep_on_failure,
        rep=reporter or Reporter(),
    )


def remove_ops(
    names: list[str], project_dir: Path | None = None, *, force: bool = False, autograd: bool = False
) -> RemoveOpsResult:
    """Remove kernels that add-op wrote: the kernel file, its test, their records in
    backendgen.json and their lines in the generated registration file, in one transaction.
    `<device>::NAME` removes an operator of the backend (its kernels, autograd, wrapper and test);
    with `autograd`, `aten::OP` removes the autograd override of OP.
    A kernel file edited since add-op wrote it is refused unless `force`, which keeps a copy
    beside it (`<file>.removed-<time>`). Nothing is rebuilt: removing a kernel is often a step
    of an upgrade, when the project does not build yet; `backendgen build` follows."""
    if not names:
        raise UserError("name at least one operator, e.g. aten::cholesky")
    project = Project.of(project_dir)
    return remove(project, names, force=force, autograd=autograd)
