"""ATen kernels: `backendgen add-op aten::<op>` gives an ATen operator a kernel of the backend's own.

One kernel file (`csrc/aten/ops/<op>.cpp`, kinds.kernelgen renders it) and its test per requested
operator; a structured out= kernel covers its functional and in-place overloads too. The records
(backendgen.json `ops`, `project.record.OpRecord`) also hold the kernels the template registers
itself (origin "template"), which add-op never writes or removes. In the registration file the kind
puts one `m.impl` per kernel and the CPU fallback registered by name for the operators that need it.
"""

from __future__ import annotations

from backendgen.kinds import kernelgen, kind
from backendgen.kinds.kind import Planned, Removal, Request
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.files import sha256_of
from backendgen.project import manifest
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
        from backendgen.kinds.registration import fallback_registrations

        fallbacks = []  # without the fallback_by_name feature, fallback.cpp keeps run_on_cpu to itself
        if "fallback_by_name" in project.features:
            fallbacks = fallback_registrations(db, lambda op: project.covering(op) is not None)
        return {"entries": project.registrations, "fallbacks": fallbacks}

    def expected_keys(self, project: Project) -> dict[str, list[str]]:
        return {}  # the probe looks each kernel up by its schema instead (check's "schemas")

    def carry(self, project: Project, db: OpDB, step) -> None:
        """Kernels add-op wrote, in the current kernel shape (merged where edited); when the template
        moves, the template's own records and the kernels a fresh project has."""
        from backendgen.kinds import aten_carry

        aten_carry.carry_kernels(project, db, step)
        if step.moves:
            aten_carry.refresh_template_records(project, db)
            aten_carry.add_default_kernels(project, db, step)

    def check(self, report, project: Project, db: OpDB, probed: dict | None) -> None:
        """Each recorded kernel against the installed torch: removed, schema or signature changed, new overloads."""
        from backendgen.commands.check import Area, Kind, Severity

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
        kernelgen.kernel_body(plan.target)  # refuse unsupported signatures before writing anything
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
