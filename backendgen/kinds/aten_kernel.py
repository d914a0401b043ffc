"""ATen kernels: `backendgen add-op aten::<op>` gives an ATen operator a kernel of the backend's own.

One kernel file (`csrc/aten/ops/<op>.cpp`, kinds.kernelgen renders it) and its test per requested
operator; a structured out= kernel covers its functional and in-place overloads too. The records
(backendgen.json `ops`, `project.record.OpRecord`) also hold the kernels the template registers
itself (origin "template"), which add-op never writes or removes. In the registration file the kind
puts one `m.impl` per kernel and the CPU fallback registered by name for the operators that need it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
from pathlib import Path

from backendgen.kinds import kernelgen, kind, registration
from backendgen.kinds.findings import Area, Kind, Severity
from backendgen.kinds.kind import Planned, Removal, Request, UpdateStep
from backendgen.plumbing import git
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.files import sha256_of, sha256_text
from backendgen.project import contract, manifest
from backendgen.project.merge import merge3
from backendgen.project.on_disk import Project, Transaction
from backendgen.project.record import OpRecord
from backendgen.torchdb.drift import Drift, classify
from backendgen.torchdb.opdb import Op, OpDB


class AtenKernels:
    name = "kernel"
    section = "ops"

    # --- add-op ------------------------------------------------------------------------------------

    def claims(self, name: str, device: str, request: Request) -> bool:
        return not name.strip().startswith(f"{device}::") and not request.autograd

    def check_request(self, names: list[str], project: Project, request: Request) -> None:
        pass

    def plan(self, names: list[str], project: Project, db: OpDB, request: Request) -> Planned:
        planned = Planned(self)
        planned.items, planned.unchanged = plan_ops(names, project, db)
        planned.notes = template_notes(project, db, planned.unchanged)
        for plan in planned.items:
            planned.notes.extend(plan.notes)
        return planned

    def qualified(self, item: kernelgen.KernelPlan) -> str:
        return item.target.qualified

    def files(self, item: kernelgen.KernelPlan, project: Project) -> list[str]:
        return list(kernel_paths(item, project))

    def tests(self, item: kernelgen.KernelPlan, project: Project) -> list[str]:
        return [kernel_paths(item, project)[1]]

    def write(self, item: kernelgen.KernelPlan, project: Project, db: OpDB, tx: Transaction) -> str:
        return write_op(project, db, item, tx)

    # --- records and remove-op ---------------------------------------------------------------------

    def records(self, project: Project) -> list[OpRecord]:
        return project.ops

    def record_files(self, rec: OpRecord) -> list[str]:
        return [rec.source] if rec.origin == "add-op" else []

    def record_tests(self, rec: OpRecord) -> list[str]:
        return [rec.test] if rec.test else []

    def removals(self, name: str, project: Project, request: Request) -> list[Removal]:
        found = _records_named(project, name)
        if not found:
            native = sorted(r.op for r in project.ops if r.origin == "add-op")
            raise ProjectError(
                f"{name!r} has no kernel in this project"
                + (
                    f" (kernels added with add-op: {', '.join(native)})"
                    if native
                    else " (no kernel was added with add-op)"
                )
            )
        sources = []
        for rec in found:
            if rec.origin != "add-op":
                raise ProjectError(
                    f"{rec.op} is part of the template ({rec.source}), not a kernel add-op wrote; edit that "
                    "file instead"
                )
            sources.append(rec.source)
        out = []
        for source in dict.fromkeys(sources):
            recs = [r for r in project.ops if r.source == source]  # a structured op's functional too
            out.append(
                Removal(
                    self,
                    source,
                    [source, *sorted({r.test for r in recs if r.test})],
                    recs,
                    edited=any(kind.edited(project, source, r.source_sha256) for r in recs),
                )
            )
        return out

    def unrecord(self, project: Project, rec: OpRecord) -> None:
        project.remove_op(rec.op)

    # --- the registration file and check -----------------------------------------------------------

    def registration(self, project: Project, db: OpDB) -> dict:
        fallbacks = []  # without the fallback_by_name feature, fallback.cpp keeps run_on_cpu to itself
        if "fallback_by_name" in project.features:
            fallbacks = fallback_registrations(db, lambda op: project.covering(op) is not None)
        if registration.FEATURE not in project.features:
            return {"entries": project.registrations, "fallbacks": fallbacks}
        # template 12 on: the kernels `new` writes in registration.cpp, those added since in
        # registration_added.cpp (an add-op then recompiles only the small unit)
        from_new = new_ops(db)
        entries, added = [], []
        for rec in project.record.ops:
            if rec.registration:
                (entries if (rec.requested or rec.op).removeprefix("aten::") in from_new else added).append(
                    rec.registration
                )
        return {"entries": entries, "added_entries": added, "fallbacks": fallbacks}

    def expected_keys(self, project: Project) -> dict[str, list[str]]:
        return {}  # the probe looks each kernel up by its schema instead (check's "schemas")

    def carry(self, project: Project, db: OpDB, step) -> None:
        """Kernels add-op wrote, in the current kernel shape (merged where edited); when the template
        moves, the template's own records and the kernels a fresh project has."""
        if step.moves:
            refuse_template_clashes(project, step.new)
        carry_kernels(project, db, step)
        if step.moves:
            refresh_template_records(project, db)
            add_default_kernels(project, db, step)

    def check(self, report, project: Project, db: OpDB, probed: dict | None) -> None:
        """Each recorded kernel against the installed torch: removed, schema or signature changed, new overloads."""
        if project.yaml_sha256 == db.yaml_sha256:
            report.add(
                Area.SCHEMA,
                Severity.OK,
                "native_functions.yaml",
                f"unchanged since generation: all {len(project.ops)} registered operators keep their schemas",
            )
            return
        if probed is not None and "schemas" not in probed:
            probed = None  # the probe did not get as far as the live schemas
        live = (probed or {}).get("schemas", {})
        for rec in project.ops:
            op = db.get(rec.op)
            entry = live.get(rec.op, {})
            if probed is not None and entry.get("live") is None:
                op = None  # the live dispatcher has no such operator
            recorded_c = entry.get("recorded", rec.schema)
            live_c = entry.get("live", op.qualified_schema if op is not None else None)
            drift = classify(rec.signature, op, schema_unchanged=recorded_c == live_c)
            if drift is Drift.REMOVED:
                base = rec.op.removeprefix("aten::").split(".")[0]
                matches = db.close_matches(rec.op)
                hint = f"; close matches: {', '.join(matches)}" if matches else ""
                report.add(
                    Area.SCHEMA,
                    Severity.ERROR,
                    rec.op,
                    f"removed from torch {db.torch_version}: remove {rec.source} or port it{hint}",
                    kind=drift,
                    close_matches=matches,
                    base=base,
                )
                continue
            new_overloads = sorted(set(o.qualified for o in db.overloads(op.base)) - set(rec.overloads or []))
            if rec.overloads and new_overloads:
                report.add(
                    Area.SCHEMA,
                    Severity.INFO,
                    rec.op,
                    f"new overloads since generation: {', '.join(new_overloads)}",
                    kind=Kind.NEW_OVERLOADS,
                    overloads=new_overloads,
                )
            if drift is Drift.UNCHANGED:
                report.add(Area.SCHEMA, Severity.OK, rec.op, "unchanged", kind=drift)
            elif drift is Drift.SCHEMA_CHANGED:
                report.add(
                    Area.SCHEMA,
                    Severity.WARNING,
                    rec.op,
                    "schema changed but the C++ kernel signature did not: check the kernel's semantics",
                    kind=drift,
                    old=recorded_c,
                    new=live_c,
                )
            else:
                report.add(
                    Area.SCHEMA,
                    Severity.ERROR,
                    rec.op,
                    f"kernel signature changed: {rec.signature}  ->  {op.signature}",
                    kind=drift,
                    old=recorded_c,
                    new=live_c,
                    old_signature=rec.signature,
                    new_signature=op.signature,
                    source=rec.source,
                )


KIND = AtenKernels()


# --- records -------------------------------------------------------------------------------------------


def template_record(project: Project, db: OpDB, op: Op) -> OpRecord:
    """The record of an operator the template registers itself (manifest.builtin_ops)."""
    return OpRecord(
        op=op.qualified,
        schema=op.qualified_schema,
        signature=op.signature,
        source=project.paths["template_kernels"],
        origin="template",
        overloads=[o.qualified for o in db.overloads(op.base)],
    )


def kernel_paths(plan: kernelgen.KernelPlan, project: Project) -> tuple[str, str]:
    """Where add-op writes the kernel file and the test of `plan`."""
    stem = plan.file_stem
    return f"{project.paths['kernels']}/{stem}.cpp", f"{project.paths['kernel_tests']}/test_{stem}.py"


def kernel_records(project: Project, db: OpDB, plan: kernelgen.KernelPlan, *, source_sha256: str) -> list[OpRecord]:
    """The records of the kernel file of `plan` as written (`source_sha256`): one per kernel in the
    file, the target's, and the functional's if it has its own (add-op; update's regenerated kernels)."""
    source, test = kernel_paths(plan, project)
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


# --- planning ------------------------------------------------------------------------------------------


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
                    f"{target} is recorded but its kernel {rec.source} is missing; restore it (e.g. git "
                    f"checkout {rec.source})"
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
        kernelgen.check_supported(plan.target)  # refuse unsupported signatures before writing anything
        plans.append(plan)
    return plans, unchanged


def no_cpu_kernel_message(op: Op, missing: Op) -> str:
    """Why add-op writes no kernel for `op`: the kernel it writes runs the CPU kernel on the device's
    memory, and `missing` (OpDB.missing_cpu_kernel: `op` or the functional its composite out= kernel
    calls) has none. One line, naming where its kernels are."""
    where = ", ".join(missing.dispatch_keys) or "no backend"
    if missing is op:
        msg = (
            f"{op.qualified} has no CPU kernel (native_functions.yaml dispatches it to {where} only) and no "
            "composite one"
        )
    else:
        msg = (
            f"{op.qualified} has no CPU kernel: its composite kernel calls {missing.qualified}, which "
            f"native_functions.yaml dispatches to {where} only"
        )
    msg += (
        ": the kernel add-op writes would call a CPU kernel that does not exist, so write this one by hand "
        "from other ATen operators"
    )
    point = manifest.load().registering(missing.qualified)
    if point is not None:
        msg += (
            f"; the current template implements {missing.qualified} ({', '.join(point.paths)}): run backendgen update"
        )
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
            notes.append(
                f"{name} runs on the device through its composite kernel, which calls {through.qualified}: "
                f"{where} registers that natively; edit its kernel there"
            )
    return notes


# --- writing -------------------------------------------------------------------------------------------


def write_op(project: Project, db: OpDB, plan: kernelgen.KernelPlan, tx: Transaction) -> str:
    """Write the kernel and test of one planned op and record it; return the qualified op."""
    source, test = kernel_paths(plan, project)
    root = project.root
    kernel_text = kernelgen.render_kernel(
        plan, device=project.device, source_path=source, torch_version=db.torch_version
    )
    test_text = kernelgen.render_test(plan, device=project.device, source_path=source)
    for rel, text in ((source, kernel_text), (test, test_text)):
        path = root / rel
        if path.exists() and path.read_text() != text:
            raise ProjectError(
                f"{rel} exists but backendgen.json does not record it; move it away (or record it) before "
                f"adding {plan.target.qualified}"
            )
        tx.write(path, text)
    kind.write_test_support(project, tx)
    for rec in kernel_records(project, db, plan, source_sha256=sha256_of(root / source)):
        project.add_op(rec)
    return plan.target.qualified


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


def new_ops(db: OpDB) -> frozenset[str]:
    """The operators whose kernels `backendgen new` writes with the installed torch, as requested
    (add.out, unfold): the manifest's `default_ops` and the view kernels derived from `db`."""
    tpl = manifest.load()
    views, _ = kernelgen.view_ops_needing_kernels(db, tpl.builtin_ops())
    return frozenset([*tpl.default_ops, *views])


def fallback_registrations(db: OpDB, is_native) -> list[str]:
    """Operators registered to the CPU fallback by name, so that the device runs the CPU's own
    kernel for them (`is_native(qualified_name)`: whether the project has a kernel for an overload):

    - the functional and in-place overloads of structured operators whose out= overload is not
      native. Otherwise PyTorch's default kernel for them allocates the result on the device and
      calls the out= overload through the fallback, running the meta function twice and warning
      where the CPU does not ("An output with one or more elements was resized");
    - operators with both a CPU kernel and a CompositeExplicitAutograd one (native_layer_norm,
      addr, ...), unless native. Otherwise a backend without a kernel runs the composite, whose
      numerics differ from the CPU kernel's (layer_norm of one element: 1/sqrt(eps) magnifies a
      last-bit difference in the mean);
    - out= overloads whose only kernel is a CompositeExplicitAutograd one while their functional
      overload has backend kernels (CPU, CUDA) and no composite one (mode.values, dot.out), unless
      native. Such a composite is written for the backends that have the functional kernel and may
      check the device type by name: mode.values refuses every device but CPU, CUDA and XPU, so on
      a PrivateUse1 device it fails before any backend kernel could run."""
    structured = [
        name for out, names in db.structured_families().items() if not is_native(f"aten::{out}") for name in names
    ]
    composite = [
        name for name in db.with_kernels_for("CPU", "CompositeExplicitAutograd") if not is_native(f"aten::{name}")
    ]
    return sorted(set(structured + composite + _composite_outs_of_backend_ops(db, is_native)))


def _composite_outs_of_backend_ops(db: OpDB, is_native) -> list[str]:
    declared = _declared_overloads()  # not the out= forms torchgen adds (`autogen`): those work anywhere
    out = []
    for name in db.with_kernels_for("CompositeExplicitAutograd"):
        op = db.get(name)
        if op is None or op.kind != "out" or set(op.dispatch_keys) != {"CompositeExplicitAutograd"}:
            continue
        if name not in declared:
            continue
        functional = db.get(op.base)
        if functional is None or functional.kind != "functional":
            continue
        keys = set(functional.dispatch_keys)
        if "CPU" in keys and "CompositeExplicitAutograd" not in keys and not is_native(f"aten::{name}"):
            out.append(name)
    return out


@functools.lru_cache(maxsize=1)
def _declared_overloads() -> frozenset[str]:
    """The overloads native_functions.yaml of the installed torch declares itself (`- func: NAME(`)."""
    import torchgen

    yaml = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return frozenset(re.findall(r"^- func: ([\w.]+)\(", yaml.read_text(), flags=re.MULTILINE))


# --- update: the kernels add-op wrote, carried to the current template and torch --------------------


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
        elif base != theirs and merge3(base, ours, theirs).conflicts:
            # Yours to edit, and edited where the kernel's shape changed (one computation
            # body, which kernels::launch queues or runs in place): the edit is the team's, so the file
            # stays as it is, with its records and test; kernel_support keeps the API it was written for.
            step.note(
                f"{source}: edited where the current kernel shape changed; left as it is (it builds as it is; "
                f"`backendgen add-op {requested}` in a fresh project shows the current shape)"
            )
            continue
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
        new_harness = kernelgen.render_harness(device=project.device, registration_files=registration.current_paths())
        old_harness = (
            _try_render(
                kernelgen.render_harness,
                device=project.device,
                registration_files=registration.paths(project),
                ops_dir=old_ops,
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
    files: torch would keep whichever of two kernels registers last) or whose kernel path is taken
    is left out, with a note."""
    tpl = manifest.load()
    views, _ = kernelgen.view_ops_needing_kernels(db, tpl.builtin_ops())
    own: set[str] = set()
    for path in sorted((project.root / "csrc").rglob("*.cpp")):
        if path.relative_to(project.root).as_posix() not in registration.paths(project):
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
        harness = kernelgen.render_harness(device=project.device, registration_files=registration.current_paths())
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
        for text in git.file_versions(project.root, source):
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


def refuse_template_clashes(project: Project, new: int) -> None:
    """Refuse (ProjectError, before anything is written) to carry a project to a template that
    registers natively an operator one of the project's add-op kernels registers: the package would
    register two kernels for it at PrivateUse1, and torch keeps whichever registers last (with a
    warning): which one runs would depend on the link order. The team chooses which kernel stays."""
    tpl = manifest.load()
    for rec in project.ops:
        point = tpl.registering(rec.op) if rec.origin == "add-op" else None
        if point is not None:
            where = ", ".join(p for p in point.paths if "*" not in p and not p.endswith("/")) or point.name
            raise ProjectError(
                f"{rec.op}: template {new} registers it itself ({where}), and so does your kernel {rec.source}; "
                f"torch would run whichever registers last: backendgen remove-op {rec.op} (copy your kernel first if "
                "you want it), then update again"
            )


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
