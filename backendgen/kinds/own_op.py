"""The backend's own operators: `backendgen add-op <device>::NAME --schema "(...) -> ..." [--body ...] [--autograd]`.

kinds.customop parses the schema and renders the files (the kernels, the autograd Function, the Python
wrapper, the test); this kind plans them, records them (backendgen.json `custom_ops`,
`project.record.OwnOpRecord`), puts their `m.def`/`m.impl` lines in the registration file and reports
in `check` a schema the installed torchgen types differently.
"""

from __future__ import annotations

from backendgen.kinds import customop, kind
from backendgen.kinds.findings import Area, Kind, Severity
from backendgen.kinds.kind import Planned, Removal, Request
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.files import sha256_of
from backendgen.project import manifest
from backendgen.project.on_disk import Project, Transaction
from backendgen.project.record import OwnOpRecord
from backendgen.torchdb.drift import Drift, signature_types
from backendgen.torchdb.opdb import OpDB


def needs_feature(project: Project) -> None:
    """Refuse a project whose template does not compile csrc/custom_ops and csrc/autograd."""
    if "custom_ops" not in project.features:
        raise ProjectError(
            f"this project is from template {project.template_version}: its setup.py does not compile csrc/custom_ops "
            f"or csrc/autograd; {project.device}:: operators and --autograd need template "
            f"{manifest.load().feature('custom_ops').since} or newer: run backendgen update"
        )


class OwnOperators:
    name = "own operator"
    section = "custom_ops"

    # --- add-op ------------------------------------------------------------------------------------

    def claims(self, name: str, device: str, request: Request) -> bool:
        return customop.is_custom_name(name, device)

    def check_request(self, names: list[str], project: Project, request: Request) -> None:
        if (request.schema is not None or request.body is not None) and len(names) != 1:
            raise UserError(
                f"--schema and --body define one operator of this backend: name exactly one {project.device}::NAME"
            )
        if names:
            needs_feature(project)

    def plan(self, names: list[str], project: Project, db: OpDB, request: Request) -> Planned:
        planned = Planned(self)
        recorded = {r.op: r for r in project.custom_ops}
        device = project.device
        for n in names:
            rec = recorded.get(f"{device}::{n.strip().removeprefix(device + '::')}")
            schema = request.schema if request.schema is not None else (rec.schema if rec else "")
            c = customop.parse(device, n, schema, body=request.body, autograd=request.autograd)
            if rec is not None:
                if rec.schema != c.schema:
                    raise ProjectError(
                        f"{c.qualified} is already defined as {rec.schema}; remove it before defining it again"
                    )
                planned.unchanged.append(c.qualified)
                continue
            if c.qualified in {x.qualified for x in planned.items}:
                continue
            for rel in c.files(project.package):
                if (project.root / rel).exists():
                    raise ProjectError(
                        f"{rel} exists but backendgen.json does not record it; move it away before "
                        f"defining {c.qualified}"
                    )
            customop.check_python(c, project.package)
            planned.items.append(c)
            planned.notes += c.notes
        return planned

    def qualified(self, item: customop.CustomOp) -> str:
        return item.qualified

    def files(self, item: customop.CustomOp, project: Project) -> list[str]:
        return item.files(project.package)

    def tests(self, item: customop.CustomOp, project: Project) -> list[str]:
        return [item.test]

    def write(self, item: customop.CustomOp, project: Project, db: OpDB, tx: Transaction) -> str:
        c, root = item, project.root
        files = {
            c.source: customop.render_kernel(c),
            c.python_module(project.package): customop.render_wrapper(c, project.package),
            c.test: customop.render_test(c, project.package),
        }
        if c.autograd:
            files[c.autograd_source] = customop.render_autograd(c)
        for rel, text in files.items():
            tx.write(root / rel, text)
        kind.write_test_support(project, tx)
        project.put(self.section, record(project, c, source_sha256=sha256_of(root / c.source)))
        return c.qualified

    # --- records and remove-op ---------------------------------------------------------------------

    def records(self, project: Project) -> list[OwnOpRecord]:
        return project.custom_ops

    def record_files(self, rec: OwnOpRecord) -> list[str]:
        return [f for f in (rec.source, rec.autograd_source, rec.python) if f]

    def record_tests(self, rec: OwnOpRecord) -> list[str]:
        return [rec.test] if rec.test else []

    def removals(self, name: str, project: Project, request: Request) -> list[Removal]:
        qualified = name.strip()
        rec = next((r for r in project.custom_ops if r.op == qualified), None)
        return kind.whole_record_removal(
            self, project, rec, have="defined", missing=f"{qualified[:80]!r} is not an operator of this backend"
        )

    def unrecord(self, project: Project, rec: OwnOpRecord) -> None:
        project.drop(self.section, rec.op)

    # --- the registration file and check -----------------------------------------------------------

    def registration(self, project: Project, db: OpDB) -> dict:
        return {"custom": recorded(project)}

    def expected_keys(self, project: Project) -> dict[str, list[str]]:
        return {r.op: ["PrivateUse1", "CPU", "Meta"] + (["Autograd"] if r.autograd else []) for r in project.custom_ops}

    def carry(self, project: Project, db: OpDB, step) -> None:
        """Nothing: after add-op an own operator's files are the team's (its kernels, its autograd); a
        later template's shapes reach them through `add-op` of a new operator, not through update."""

    def check(self, report, project: Project, db: OpDB, probed: dict | None) -> None:
        """A schema the installed torchgen no longer parses or types differently; in the built library,
        every operator with all its kernels."""
        for r in project.custom_ops:
            if not r.signature:
                continue
            try:
                c = customop.parse(project.device, r.op, r.schema, body=r.body, autograd=bool(r.autograd))
            except UserError as e:
                report.add(
                    Area.SCHEMA,
                    Severity.ERROR,
                    r.op,
                    f"its schema no longer parses with torch {db.torch_version}'s torchgen: {e}",
                    kind=Kind.CUSTOM_SCHEMA,
                )
                continue
            now = signature(c)
            if signature_types(now) != signature_types(r.signature):
                report.add(
                    Area.SCHEMA,
                    Severity.ERROR,
                    r.op,
                    f"torch {db.torch_version} types its schema differently: {r.signature}  ->  {now}; "
                    f"edit the kernels in {r.source} to the new types",
                    kind=Drift.SIGNATURE_CHANGED,
                    old_signature=r.signature,
                    new_signature=now,
                    source=r.source,
                )
        keyed = kind.keyed(probed)
        ops = project.custom_ops
        if keyed is not None and ops and all(all(keyed.get(r.op, {}).values()) for r in ops):
            report.add(
                Area.EXTENSION,
                Severity.OK,
                f"{project.device}::*",
                f"{len(ops)} operator{'s' if len(ops) != 1 else ''} of the backend registered with all their kernels",
            )


KIND = OwnOperators()


def signature(c: customop.CustomOp) -> str:
    """The C++ signature of `c`'s kernels, as recorded."""
    return c.op.signature.replace(" NAME(", f" {c.name}(", 1)


def record(project: Project, c: customop.CustomOp, *, source_sha256: str) -> OwnOpRecord:
    """The record of the backend's own operator `c` as written."""
    return OwnOpRecord(
        op=c.qualified,
        schema=c.schema,
        body=c.body or None,
        autograd=c.autograd,
        signature=signature(c),
        source=c.source,
        autograd_source=c.autograd_source if c.autograd else None,
        python=c.python_module(project.package),
        test=c.test,
        source_sha256=source_sha256,
    )


def recorded(project: Project) -> list[customop.CustomOp]:
    """The backend's own operators backendgen.json records, typed again by the installed torchgen."""
    out = []
    for r in project.custom_ops:
        try:
            out.append(customop.parse(project.device, r.op, r.schema, body=r.body, autograd=bool(r.autograd)))
        except UserError as e:
            raise ProjectError(f"backendgen.json: the record of {r.op[:80]} is malformed ({e})") from None
    return out
