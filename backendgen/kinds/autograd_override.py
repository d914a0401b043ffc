"""Autograd overrides: `backendgen add-op aten::<op> --autograd` replaces PyTorch's derivative formula
for one ATen operator on the device.

kinds.overrides plans and renders the files (the `torch::autograd::Function`, its test); this kind
records them (backendgen.json `autograd_overrides`, `project.record.OverrideRecord`), puts their
`m.impl` at AutogradPrivateUse1 in the registration file and reports in `check` an operator whose schema
changed or that the installed torch removed.
"""

from __future__ import annotations

from backendgen.kinds import kind, overrides
from backendgen.kinds.findings import Area, Severity
from backendgen.kinds.kind import Planned, Removal, Request
from backendgen.kinds.own_op import needs_feature
from backendgen.plumbing.errors import ProjectError
from backendgen.plumbing.files import sha256_of
from backendgen.project.on_disk import Project, Transaction
from backendgen.project.record import OverrideRecord
from backendgen.torchdb.drift import Drift, classify
from backendgen.torchdb.opdb import OpDB


class AutogradOverrides:
    name = "autograd override"
    section = "autograd_overrides"

    # --- add-op ------------------------------------------------------------------------------------

    def claims(self, name: str, device: str, request: Request) -> bool:
        return request.autograd and not name.strip().startswith(f"{device}::")

    def check_request(self, names: list[str], project: Project, request: Request) -> None:
        if names:
            needs_feature(project)

    def plan(self, names: list[str], project: Project, db: OpDB, request: Request) -> Planned:
        planned = Planned(self)
        recorded = {r.op for r in project.autograd_overrides}
        for n in names:
            op = db.resolve(n)
            ov = overrides.plan(op, project.device)
            if op.qualified in recorded:
                planned.unchanged.append(op.qualified)
            elif op.qualified not in {o.op.qualified for o in planned.items}:
                for rel in ov.files:
                    if (project.root / rel).exists():
                        raise ProjectError(
                            f"{rel} exists but backendgen.json does not record it; move it away "
                            f"before overriding {op.qualified}"
                        )
                overrides.render(ov, torch_version=db.torch_version)  # refuses what it cannot write, before writing
                planned.items.append(ov)
                planned.notes.append(overrides.NOTE.format(op=op.qualified, source=ov.source))
        return planned

    def qualified(self, item: overrides.Override) -> str:
        return item.op.qualified

    def files(self, item: overrides.Override, project: Project) -> list[str]:
        return item.files

    def tests(self, item: overrides.Override, project: Project) -> list[str]:
        return [item.test]

    def write(self, item: overrides.Override, project: Project, db: OpDB, tx: Transaction) -> str:
        ov, root = item, project.root
        tx.write(root / ov.source, overrides.render(ov, torch_version=db.torch_version))
        tx.write(root / ov.test, overrides.render_test(ov))
        kind.write_test_support(project, tx)
        project.put(
            self.section,
            OverrideRecord(
                op=ov.op.qualified,
                schema=ov.op.qualified_schema,
                signature=ov.op.signature,
                source=ov.source,
                test=ov.test,
                source_sha256=sha256_of(root / ov.source),
            ),
        )
        return ov.op.qualified

    # --- records and remove-op ---------------------------------------------------------------------

    def records(self, project: Project) -> list[OverrideRecord]:
        return project.autograd_overrides

    def record_files(self, rec: OverrideRecord) -> list[str]:
        return [rec.source]

    def record_tests(self, rec: OverrideRecord) -> list[str]:
        return [rec.test] if rec.test else []

    def removals(self, name: str, project: Project, request: Request) -> list[Removal]:
        bare = name.strip().removeprefix("aten::")
        rec = next(
            (
                r
                for r in project.autograd_overrides
                if r.op.removeprefix("aten::") in (bare, f"{bare}.default")
                or r.op.removeprefix("aten::").split(".")[0] == bare
            ),
            None,
        )
        return kind.whole_record_removal(
            self, project, rec, have="overridden", missing=f"{name[:80]!r} has no autograd override in this project"
        )

    def unrecord(self, project: Project, rec: OverrideRecord) -> None:
        project.drop(self.section, rec.op)

    # --- the registration file and check -----------------------------------------------------------

    def registration(self, project: Project, db: OpDB) -> dict:
        """The recorded overrides the installed torch still has (`check` reports the others)."""
        live = []
        for r in project.autograd_overrides:
            op = db.get(r.op)
            if op is not None and op.qualified == r.op:
                live.append(overrides.Override(op, project.device))
        return {"overrides": live}

    def expected_keys(self, project: Project) -> dict[str, list[str]]:
        return {r.op: ["AutogradPrivateUse1"] for r in project.autograd_overrides}

    def carry(self, project: Project, db: OpDB, step) -> None:
        """Nothing: after add-op an override's backward is the team's to write; update leaves it."""

    def check(self, report, project: Project, db: OpDB, probed: dict | None) -> None:
        for r in project.autograd_overrides:
            op = db.get(r.op)
            if op is not None and op.qualified != r.op:
                op = None
            drift = classify(r.signature, op, schema_unchanged=op is not None and op.qualified_schema == r.schema)
            if drift is Drift.REMOVED:
                report.add(
                    Area.SCHEMA,
                    Severity.ERROR,
                    r.op,
                    f"autograd override of an operator removed from torch {db.torch_version}: "
                    f"delete {r.source}, {r.test} and its entry in backendgen.json",
                    kind=drift,
                )
            elif drift is not Drift.UNCHANGED:
                report.add(
                    Area.SCHEMA,
                    Severity.WARNING if drift is Drift.SCHEMA_CHANGED else Severity.ERROR,
                    r.op,
                    f"schema changed since the autograd override was written ({r.source}): {op.qualified_schema}",
                    kind=drift,
                    old=r.schema,
                    new=op.qualified_schema,
                )


KIND = AutogradOverrides()
