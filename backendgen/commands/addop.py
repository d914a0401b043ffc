"""The add-op engine: what `add-op` and `remove-op` do to a project, behind api.add_ops/remove_ops.

`add` holds the project's lock for the whole command and gates it (the torch the project targets,
the test tools, a hand-edited registration file) before it plans: `plan_extras` sorts the names
into the backend's own operators, autograd overrides and ATen kernels and refuses what does not
fit together, `plan_ops` plans the ATen kernels (kernelgen.plan_kernel) not yet native. Then one
`project.Transaction` (`edit_transaction`: with the built extension) writes every file, the
records and the registration file (backendgen.kinds.registration); the build runs with the new tests'
process started early (build.tests_started_early); a failure or an interrupt rolls every file back,
unless `keep_on_failure` keeps them for a look. `remove` is the reverse, without a build.

The records backendgen.json keeps of what a command wrote are made here, one function per kind
(`template_record`, `kernel_records`, `custom_record`, `override_record`), for every command that
records (new, add-op, update).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from backendgen.toolchain import build
from backendgen.commands import consistency
from backendgen.kinds import customop, kernelgen, overrides, registration
from backendgen.plumbing import faults
from backendgen.project import manifest
from backendgen.torchdb import support
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.files import sha256_of, writes
from backendgen.torchdb.opdb import Op, OpDB, load_opdb
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import OpRecord, Project, Transaction


# --- gating and transactions -----------------------------------------------------------------------

def torch_note(version: str, rep: Reporter) -> str | None:
    """Apply the support policy (backendgen.torchdb.support): refuse a torch older than the minimum; for one
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


def edit_transaction(project: Project) -> Transaction:
    """A transaction for a command that edits and rebuilds the project: a rollback also restores the
    built extension (a failed build may have replaced it) and the record of what it was built from."""
    tx = Transaction(project.root)
    so = build.extension_path(project.root, project.package)
    if so is not None:
        tx.touch_file(so)
        tx.touch_file(project.root / build.BUILT)  # what that library was built from goes back with it
    return tx


# --- records (backendgen.json) ---------------------------------------------------------------------

def template_record(db: OpDB, op: Op) -> OpRecord:
    """The record of an operator the template registers itself (manifest.builtin_ops)."""
    return OpRecord(op=op.qualified, schema=op.qualified_schema, signature=op.signature, source=manifest.load().path("template_kernels"),
                    origin="template", overloads=[o.qualified for o in db.overloads(op.base)])


def kernel_paths(plan: kernelgen.KernelPlan) -> tuple[str, str]:
    """Where add-op writes the kernel file and the test of `plan` (the installed manifest's paths: every
    template puts kernels where the current one does)."""
    stem, paths = plan.file_stem, manifest.load().paths
    return f"{paths['kernels']}/{stem}.cpp", f"{paths['kernel_tests']}/test_{stem}.py"


def kernel_records(project: Project, db: OpDB, plan: kernelgen.KernelPlan, *, source_sha256: str) -> list[OpRecord]:
    """The records of the kernel file of `plan` as written (`source_sha256`): one per kernel in the
    file, the target's, and the functional's if it has its own (add-op; update's regenerated kernels)."""
    source, test = kernel_paths(plan)
    return [
        OpRecord(
            op=op.qualified,
            schema=op.qualified_schema,
            signature=op.signature,
            source=source,
            origin="add-op",
            test=test,
            requested=plan.requested.qualified,
            covers=[c for c in plan.covers if c != op.qualified] if op is plan.target else [],
            overloads=[o.qualified for o in db.overloads(op.base)],
            source_sha256=source_sha256,
            registration=kernelgen.registration_entry(plan, device=project.device, op=op),
        )
        for op in [plan.target] + ([plan.functional] if plan.functional else [])
    ]


def custom_record(project: Project, c: customop.CustomOp, *, source_sha256: str) -> dict:
    """The record (backendgen.json `custom_ops`) of the backend's own operator `c` as written."""
    return {
        "op": c.qualified, "schema": c.schema, **({"body": c.body} if c.body else {}), "autograd": c.autograd,
        "signature": c.op.signature.replace(" NAME(", f" {c.name}(", 1),
        "source": c.source, **({"autograd_source": c.autograd_source} if c.autograd else {}),
        "python": c.python_module(project.package), "test": c.test,
        "source_sha256": source_sha256,
    }


def override_record(ov: overrides.Override, *, source_sha256: str) -> dict:
    """The record (backendgen.json `autograd_overrides`) of the autograd override `ov` as written."""
    return {
        "op": ov.op.qualified, "schema": ov.op.qualified_schema, "signature": ov.op.signature,
        "source": ov.source, "test": ov.test, "source_sha256": source_sha256,
    }


# --- planning --------------------------------------------------------------------------------------

def plan_ops(names: list[str], project: Project, db: OpDB) -> tuple[list[kernelgen.KernelPlan], list[str]]:
    """Plans for the ops not yet native in `project`, and the requested ops that already are."""
    plans, unchanged, seen = [], [], set()
    for name in names:
        # a project from template 1 has a kernel_support.h without the helpers newer kernels use
        plan = kernelgen.plan_kernel(db, db.resolve(name), features=project.features)
        target = plan.target.qualified
        rec = project.covering(target)
        if rec is not None:
            if rec.source and rec.origin == "add-op" and not (project.root / rec.source).exists():
                raise ProjectError(
                    f"{target} is recorded but its kernel {rec.source} is missing; restore it (e.g. git checkout {rec.source})"
                )
            unchanged.append(plan.requested.qualified)
            continue
        if target in seen:
            continue
        seen.add(target)
        missing = db.missing_cpu_kernel(plan.target)
        if missing is not None:
            if missing is not plan.target and project.covering(missing.qualified) is not None:
                unchanged.append(plan.requested.qualified)  # its composite kernel runs the native one
                continue
            raise UserError(no_cpu_kernel_message(plan.target, missing))
        kernelgen.kernel_body(plan.target)  # refuse unsupported signatures before writing anything
        plans.append(plan)
    return plans, unchanged


def no_cpu_kernel_message(op: Op, missing: Op) -> str:
    """Why add-op writes no kernel for `op`: the kernel it writes runs the CPU kernel on the device's
    memory, and `missing` (OpDB.missing_cpu_kernel: `op` or the functional its composite out= kernel
    calls) has none. One line, naming where its kernels are."""
    where = ", ".join(missing.dispatch_keys) or "no backend"
    if missing is op:
        msg = f"{op.qualified} has no CPU kernel (native_functions.yaml dispatches it to {where} only) and no composite one"
    else:
        msg = (f"{op.qualified} has no CPU kernel: its composite kernel calls {missing.qualified}, which "
               f"native_functions.yaml dispatches to {where} only")
    msg += (": the kernel add-op writes would call a CPU kernel that does not exist, so write this one by hand "
            "from other ATen operators")
    point = manifest.load().registering(missing.qualified)
    if point is not None:
        msg += f"; the current template implements {missing.qualified} ({', '.join(point.paths)}): run backendgen update"
    return msg


def template_notes(project: Project, db: OpDB, names: list[str]) -> list[str]:
    """For the requested operators in `names` (plan_ops' unchanged ones) that the template itself
    makes native, or that run through a composite kernel calling one it makes native: where."""
    notes = []
    for name in names:
        rec = project.covering(name)
        through = None
        if rec is None:
            missing = db.missing_cpu_kernel(db.resolve(name))
            rec = project.covering(missing.qualified) if missing is not None else None
            through = missing
        if rec is None or rec.origin != "template":
            continue
        point = manifest.load().registering(rec.op)
        where = f"{', '.join(point.paths)} ({point.name})" if point is not None else rec.source
        if through is None:
            notes.append(f"{name} is native in the template: {where} registers it; edit its kernel there")
        else:
            notes.append(f"{name} runs on the device through its composite kernel, which calls {through.qualified}: "
                         f"{where} registers that natively; edit its kernel there")
    return notes


@dataclass
class Extras:
    """What add-op plans besides ATen kernels: the backend's own operators and autograd overrides."""
    aten: list[str] = field(default_factory=list)  # names left for plan_ops
    custom: list[customop.CustomOp] = field(default_factory=list)
    overrides: list[overrides.Override] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def work(self) -> bool:
        return bool(self.custom or self.overrides)

    @property
    def tests(self) -> list[str]:
        return [c.test for c in self.custom] + [o.test for o in self.overrides]

    def files(self, package: str) -> list[tuple[str, list[str]]]:
        return [(c.qualified, c.files(package)) for c in self.custom] + [(o.op.qualified, o.files) for o in self.overrides]


def plan_extras(names: list[str], project: Project, db: OpDB, *, schema: str | None, body: str | None,
                autograd: bool) -> Extras:
    """Sort `names` into the backend's own operators (`<device>::NAME`, defined from `schema`), ATen
    autograd overrides (`autograd`) and plain ATen kernels; refuse what does not fit together."""
    device = project.device
    extras = Extras()
    custom_names = [n for n in names if customop.is_custom_name(n, device)]
    for n in names:
        ns, sep, _ = n.strip().partition("::")
        if sep and ns not in ("aten", device):
            raise UserError(f"{n[:80]!r}: add-op defines operators in this backend's namespace ({device}::NAME) "
                            "and writes kernels for aten:: operators")
    if (schema is not None or body is not None) and len(custom_names) != 1:
        raise UserError(f"--schema and --body define one operator of this backend: name exactly one {device}::NAME")
    if (custom_names or autograd) and "custom_ops" not in project.features:
        raise ProjectError(
            f"this project is from template {project.template_version}: its setup.py does not compile csrc/custom_ops "
            f"or csrc/autograd; {device}:: operators and --autograd need template "
            f"{manifest.load().feature('custom_ops').since} or newer: run backendgen update"
        )
    recorded_custom = {d["op"]: d for d in project.custom_ops}
    recorded_overrides = {d["op"] for d in project.autograd_overrides}
    for n in names:
        if n in custom_names:
            rec = recorded_custom.get(f"{device}::{n.strip().removeprefix(device + '::')}")
            c = customop.parse(device, n, schema if schema is not None else (rec or {}).get("schema", ""), body=body,
                               autograd=autograd)
            if rec is not None:
                if rec["schema"] != c.schema:
                    raise ProjectError(f"{c.qualified} is already defined as {rec['schema']}; remove it before "
                                       "defining it again")
                extras.unchanged.append(c.qualified)
                continue
            if c.qualified in {x.qualified for x in extras.custom}:
                continue
            for rel in c.files(project.package):
                if (project.root / rel).exists():
                    raise ProjectError(f"{rel} exists but backendgen.json does not record it; move it away before "
                                       f"defining {c.qualified}")
            customop.check_python(c, project.package)
            extras.custom.append(c)
            extras.notes += c.notes
        elif autograd:
            op = db.resolve(n)
            ov = overrides.plan(op, device)
            if op.qualified in recorded_overrides:
                extras.unchanged.append(op.qualified)
            elif op.qualified not in {o.op.qualified for o in extras.overrides}:
                for rel in ov.files:
                    if (project.root / rel).exists():
                        raise ProjectError(f"{rel} exists but backendgen.json does not record it; move it away "
                                           f"before overriding {op.qualified}")
                overrides.render(ov, torch_version=db.torch_version)  # refuses what it cannot write, before writing
                extras.overrides.append(ov)
                extras.notes.append(overrides.NOTE.format(op=op.qualified, source=ov.source))
        else:
            extras.aten.append(n)
    return extras



# --- writing -----------------------------------------------------------------------------------------

def write_op(project: Project, db: OpDB, plan: kernelgen.KernelPlan, tx: Transaction) -> str:
    """Write the kernel and test of one planned op and record it; return the qualified op."""
    source, test = kernel_paths(plan)
    root = project.root
    kernel_text = kernelgen.render_kernel(plan, device=project.device, source_path=source, torch_version=db.torch_version)
    test_text = kernelgen.render_test(plan, device=project.device, source_path=source)
    for rel, text in ((source, kernel_text), (test, test_text)):
        path = root / rel
        if path.exists() and path.read_text() != text:
            raise ProjectError(
                f"{rel} exists but backendgen.json does not record it; move it away (or record it) before adding {plan.target.qualified}"
            )
        tx.write(path, text)
    _write_test_support(project, tx)
    for rec in kernel_records(project, db, plan, source_sha256=sha256_of(root / source)):
        project.add_op(rec)
    return plan.target.qualified


def _write_custom(project: Project, c: customop.CustomOp, tx: Transaction) -> str:
    root = project.root
    files = {c.source: customop.render_kernel(c), c.python_module(project.package): customop.render_wrapper(c, project.package),
             c.test: customop.render_test(c, project.package)}
    if c.autograd:
        files[c.autograd_source] = customop.render_autograd(c)
    for rel, text in files.items():
        tx.write(root / rel, text)
    _write_test_support(project, tx)
    project.record("custom_ops", custom_record(project, c, source_sha256=sha256_of(root / c.source)))
    return c.qualified


def _write_override(project: Project, ov: overrides.Override, db: OpDB, tx: Transaction) -> str:
    root = project.root
    tx.write(root / ov.source, overrides.render(ov, torch_version=db.torch_version))
    tx.write(root / ov.test, overrides.render_test(ov))
    _write_test_support(project, tx)
    project.record("autograd_overrides", override_record(ov, source_sha256=sha256_of(root / ov.source)))
    return ov.op.qualified


def _write_test_support(project: Project, tx: Transaction) -> None:
    harness = kernelgen.render_harness(device=project.device, registration_file=project.registration_file)
    paths = project.paths
    for rel, text in ((f"{paths['kernel_tests']}/__init__.py", ""), (paths["kernel_harness"], harness)):
        if not (project.root / rel).exists():
            tx.write(project.root / rel, text)


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


def add(project: Project, names: list[str], *, schema: str | None, body: str | None, autograd: bool, build_it: bool,
        test_it: bool, dry_run: bool, keep_on_failure: bool, rep: Reporter) -> AddOpsResult:
    """api.add_ops on a loaded project."""
    result = AddOpsResult(project.root)
    with project.lock():
        state = consistency.inspect(project)  # record vs files vs built library, before anything
        consistency.require_files(project, state)
        with rep.step("resolve"):
            db = load_opdb()
            result.torch_note = torch_note(db.torch_version, rep)
            check_torch(project, db)
            extras = plan_extras(names, project, db, schema=schema, body=body, autograd=autograd)
            result.unchanged += extras.unchanged
            result.notes += extras.notes
            plans, unchanged = plan_ops(extras.aten, project, db) if extras.aten else ([], [])
            result.unchanged += unchanged
            result.notes += template_notes(project, db, unchanged)
            if (plans or extras.work) and build_it and test_it and not dry_run:
                build.check_test_tools()
            for plan in plans:
                result.notes.extend(plan.notes)
            rewrite_registration = registration.needs_rewrite(project, db)
        # recorded by an earlier run that was stopped before its build finished: this run builds them
        pending = consistency.unbuilt_records(project, state) if build_it and not dry_run else []
        if pending:
            result.unchanged = [n for n in result.unchanged if n not in pending
                                and getattr(project.covering(n), "op", None) not in pending]
            result.added += pending
            result.notes.append(f"{', '.join(pending)} {'is' if len(pending) == 1 else 'are'} recorded in backendgen.json "
                                "but the library was not built with it since (an earlier run stopped): building now")
        if not plans and not extras.work and not rewrite_registration and not pending:
            return result
        if dry_run:
            for plan in plans:
                result.files += [project.root / p for p in kernel_paths(plan)]
                result.added.append(plan.target.qualified)
            for qualified, files in extras.files(project.package):
                result.files += [project.root / f for f in files]
                result.added.append(qualified)
            result.files.append(project.root / project.registration_file)
            return result
        tx = edit_transaction(project)
        try:
            if plans or extras.work or rewrite_registration:
                _write_all(project, db, plans, extras, tx, result, rep)
                faults.reached("add-op:written")
            if build_it:
                tests = [kernel_paths(plan)[1] for plan in plans] + extras.tests if test_it else []
                tests += _tests_of(project, pending) if test_it else []
                _build_and_test(project, tests, result, rep)
        except BaseException as exc:
            if keep_on_failure and not isinstance(exc, KeyboardInterrupt):
                if hasattr(exc, "hint"):
                    exc.hint = "the new files were kept (--keep-on-failure): " + ", ".join(
                        str(p.relative_to(project.root)) for p in result.files
                    )
            else:
                tx.rollback()
            raise
    return result


def _tests_of(project: Project, ops: list[str]) -> list[str]:
    """The test files recorded for `ops` (kernels, own operators, overrides) that exist."""
    records = [{"op": r.op, "test": r.test} for r in project.ops] + project.custom_ops + project.autograd_overrides
    tests = [d["test"] for d in records if d["op"] in ops and d.get("test")]
    return [t for t in dict.fromkeys(tests) if (project.root / t).is_file()]


def _write_all(project: Project, db: OpDB, plans, extras: Extras, tx: Transaction, result: AddOpsResult,
               rep: Reporter) -> None:
    """Write every planned file, the registration file and the record (add-op's one write step)."""
    with rep.step("write"), writes(project.root, "the project was left as it was"):
        result.added += [write_op(project, db, plan, tx) for plan in plans]
        result.added += [_write_custom(project, c, tx) for c in extras.custom]
        result.added += [_write_override(project, ov, db, tx) for ov in extras.overrides]
        registration.write(project, db, tx)
        tx.write(project.metadata_path, project.metadata_text())
        result.files = [p for p in tx.written if p.exists() and p.suffix != ".so"]


def _build_and_test(project: Project, tests: list[str], result: AddOpsResult, rep: Reporter) -> None:
    """Build incrementally and run the new `tests`. The tests' process imports torch and the OpInfo
    database while the kernels compile (only into an installed project: a first install is not
    visible to a running process)."""
    early = tests and build.installed_from(project.root, project.data["dist_name"])
    with (build.tests_started_early(project.root, tests, name="add-op-test") if early
          else contextlib.nullcontext()) as run_early:
        with rep.step("build"):
            build.build(project.root, project.package, project.data["dist_name"])
        result.built = True
        if tests:
            with rep.step("test"):
                if run_early is not None:
                    log = run_early()
                else:
                    log = build.run_tests(project.root, tests, name="add-op-test")
            result.tested = True
            result.skipped = build.skipped_tests(log)


# --- remove-op -------------------------------------------------------------------------------------

@dataclass
class RemoveOpsResult:
    root: Path
    removed: list[str] = field(default_factory=list)  # qualified ops whose kernel is gone
    files: list[Path] = field(default_factory=list)  # deleted kernel and test files
    backups: list[Path] = field(default_factory=list)  # copies of edited files removed with force


def _records_named(project: Project, name: str) -> list[OpRecord]:
    """The records `name` designates: an operator as recorded, requested or covered ("aten::abs.out",
    "abs"), or a bare name for every overload recorded under it. Works for operators the
    installed torch no longer has (that is when a kernel is removed most often)."""
    bare = name.strip().removeprefix("aten::")
    qualified = f"aten::{bare}"
    found = [r for r in project.ops if qualified in (r.op, r.requested, *r.covers)]
    if not found and "." not in bare:
        found = [r for r in project.ops if r.op.removeprefix("aten::").split(".")[0] == bare]
    return found


def _extra_named(project: Project, name: str, autograd: bool) -> tuple[str, dict] | None:
    """The record of the backend's own operator `name`, or (with `autograd`) of the autograd
    override of ATen operator `name`, as (its section in backendgen.json, the record)."""
    if customop.is_custom_name(name, project.device):
        qualified = name.strip()
        rec = next((d for d in project.custom_ops if d["op"] == qualified), None)
        if rec is None:
            have = ", ".join(d["op"] for d in project.custom_ops) or "none"
            raise ProjectError(f"{qualified[:80]!r} is not an operator of this backend (defined: {have})")
        return "custom_ops", rec
    if autograd:
        bare = name.strip().removeprefix("aten::")
        rec = next((d for d in project.autograd_overrides
                    if d["op"].removeprefix("aten::") in (bare, f"{bare}.default")
                    or d["op"].removeprefix("aten::").split(".")[0] == bare), None)
        if rec is None:
            have = ", ".join(d["op"] for d in project.autograd_overrides) or "none"
            raise ProjectError(f"{name[:80]!r} has no autograd override in this project (overridden: {have})")
        return "autograd_overrides", rec
    return None


def _extra_files(rec: dict) -> list[str]:
    return [f for f in (rec.get("source"), rec.get("autograd_source"), rec.get("python"), rec.get("test")) if f]


def remove(project: Project, names: list[str], *, force: bool, autograd: bool) -> RemoveOpsResult:
    """api.remove_ops on a loaded project."""
    import shutil
    import time

    result = RemoveOpsResult(project.root)
    with project.lock():
        state = consistency.inspect(project)  # a missing file is fine only if it belongs to what is removed
        sources: dict[str, list[OpRecord]] = {}
        extras: list[tuple[str, dict]] = []
        for name in names:
            extra = _extra_named(project, name, autograd)
            if extra is not None:
                extras.append(extra)
                continue
            found = _records_named(project, name)
            if not found:
                native = sorted(r.op for r in project.ops if r.origin == "add-op")
                raise ProjectError(
                    f"{name!r} has no kernel in this project"
                    + (f" (kernels added with add-op: {', '.join(native)})" if native else " (no kernel was added with add-op)")
                )
            for rec in found:
                if rec.origin != "add-op":
                    raise ProjectError(
                        f"{rec.op} is part of the template ({rec.source}), not a kernel add-op wrote; edit that file instead"
                    )
                sources.setdefault(rec.source, [])
        for rec in project.ops:  # every kernel of a removed file: a structured op's functional too
            if rec.source in sources:
                sources[rec.source].append(rec)
        consistency.require_files(project, state, ignore=(*sources, *(f for _, rec in extras for f in _extra_files(rec))))
        db = load_opdb()
        registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
        edited = [src for src, recs in sources.items() if (project.root / src).exists()
                  and any(r.source_sha256 and r.source_sha256 != sha256_of(project.root / src) for r in recs)]
        edited += [rec["source"] for _, rec in extras if (project.root / rec["source"]).exists()
                   and rec.get("source_sha256") and rec["source_sha256"] != sha256_of(project.root / rec["source"])]
        if edited and not force:
            raise ProjectError(
                f"{', '.join(edited)} changed since add-op wrote it; pass --force to remove it anyway "
                "(a copy is kept beside it)"
            )
        tx = Transaction(project.root)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            with writes(project.root, "the project was left as it was"):
                groups = [(src, [src, *sorted({r.test for r in recs if r.test})], recs) for src, recs in sources.items()]
                groups += [(rec["source"], _extra_files(rec), []) for _, rec in extras]
                for src, files, recs in groups:
                    for rel in files:
                        path = project.root / rel
                        if not path.exists():
                            continue
                        if src in edited:
                            backup = path.with_name(f"{path.name}.removed-{stamp}")
                            tx.touch_file(backup)  # a rollback removes the copy again
                            shutil.copy2(path, backup)
                            result.backups.append(backup)
                        tx.remove(path)
                        result.files.append(path)
                    for rec in recs:
                        project.remove_op(rec.op)
                        result.removed.append(rec.op)
                for section, rec in extras:
                    project.unrecord(section, rec["op"])
                    result.removed.append(rec["op"])
                registration.write(project, db, tx)  # the installed torch's: remove-op is an upgrade step
                tx.write(project.metadata_path, project.metadata_text())
        except BaseException:
            tx.rollback()
            raise
    return result

