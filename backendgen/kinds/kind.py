"""The operator-kind protocol: what add-op, remove-op, check, update and the registration file ask of
every kind of operator a project registers.

A kind is one module of this package exposing `KIND`, an object with the methods of `OperatorKind`;
`registry.KINDS` lists them in the order add-op offers them a name (the first that claims it plans it).
The commands loop over the kinds and never branch on one: a new kind (a nested-tensor kernel, a fused
RNN cell) is a new module and a line in the registry (docs/architecture.md, "Adding an operator kind").

Each kind keeps its own typed records in its own list of backendgen.json (`section`;
backendgen.project.record), writes its own files, contributes its own variables to the registration
file's template, and reports its own drift in `check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from backendgen.kinds.findings import CheckReport
    from backendgen.project.on_disk import Project, Transaction
    from backendgen.torchdb.opdb import OpDB


@dataclass(frozen=True)
class Request:
    """What add-op or remove-op was asked besides the operator names."""

    schema: str | None = None  # --schema: defines the backend's own operator
    body: str | None = None  # --body: what that operator computes
    autograd: bool = False  # --autograd


@dataclass
class Planned:
    """One kind's share of an add-op: the items it will write (kind-specific), the names that are
    native already, and notes for the user."""

    kind: OperatorKind
    items: list[Any] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Removal:
    """What remove-op deletes for one source file: the files, and the records (of `kind`) they hold.
    `edited`: the source differs from what add-op wrote (refused without --force)."""

    kind: OperatorKind
    source: str
    files: list[str]
    records: list[Any]
    edited: bool = False


class UpdateStep(Protocol):
    """What `backendgen update` offers a kind carrying its files to the current template (and torch):
    the planned whole-file writes, merged 3-way; nothing is written until the whole plan is made."""

    old: int  # the template version the project comes from
    new: int  # the current one
    old_dir: Path | None  # the older template's tree (None: the current one)
    old_torch: str  # the torch the project targeted
    skip: set[str]  # files `--torch` could not fix: left alone
    moves: bool  # the template moves (not only the torch)

    def read(self, rel: str) -> str | bytes | None:
        """The file as planned so far (None: absent)."""

    def merge(
        self, rel: str, base: str | bytes | None, theirs: str | bytes | None, *, regenerated: bool = False
    ) -> None:
        """Plan `rel` as `base` -> `theirs` merged into the project's file."""

    def add(self, rel: str, text: str, why: str = "") -> None:
        """Plan a new file."""

    def note(self, text: str) -> None:
        """Tell the user something about the update."""


class OperatorKind(Protocol):
    name: str  # how messages name an operator of the kind ("kernel", "own operator", "autograd override")
    section: str  # its list in backendgen.json

    def claims(self, name: str, device: str, request: Request) -> bool:
        """Whether a name add-op or remove-op was given is one of this kind's."""

    def check_request(self, names: list[str], project: Project, request: Request) -> None:
        """Refuse (UserError/ProjectError) what the kind cannot do with `names` (its claimed ones) in `project`."""

    def plan(self, names: list[str], project: Project, db: OpDB, request: Request) -> Planned:
        """Plan the claimed `names`; refuse what cannot be written, before anything is."""

    def qualified(self, item: Any) -> str:
        """The operator a planned item makes native."""

    def files(self, item: Any, project: Project) -> list[str]:
        """The files writing `item` creates, relative to the project root."""

    def tests(self, item: Any, project: Project) -> list[str]:
        """The test files of `item` that add-op runs after its build."""

    def write(self, item: Any, project: Project, db: OpDB, tx: Transaction) -> str:
        """Write `item`'s files through `tx` and record it; return the qualified operator."""

    def records(self, project: Project) -> list[Any]:
        """The kind's records in `project` (typed: backendgen.project.record)."""

    def record_files(self, rec: Any) -> list[str]:
        """The files a record names (those a build compiles first)."""

    def record_tests(self, rec: Any) -> list[str]:
        """The test files a record names."""

    def removals(self, name: str, project: Project, request: Request) -> list[Removal]:
        """What remove-op deletes for the claimed `name`; ProjectError naming what exists when nothing matches."""

    def unrecord(self, project: Project, rec: Any) -> None:
        """Forget `rec` (remove-op)."""

    def registration(self, project: Project, db: OpDB) -> dict[str, Any]:
        """The kind's variables for the registration file's template (registration.render)."""

    def expected_keys(self, project: Project) -> dict[str, list[str]]:
        """The dispatch keys each recorded operator of the kind must have a kernel for (check)."""

    def carry(self, project: Project, db: OpDB, step: UpdateStep) -> None:
        """`backendgen update`: bring the kind's files and records to the current template and torch."""

    def check(self, report: CheckReport, project: Project, db: OpDB, probed: dict | None) -> None:
        """Report how the kind's records stand in the installed torch and in the built library
        (`probed`: what check's probe found; `keyed(probed)`: the kernels the library registers)."""


def edited(project: Project, source: str, recorded_sha256: str | None) -> bool:
    """Whether `source` exists and differs from what a command recorded writing."""
    from backendgen.plumbing.files import sha256_of

    path = project.root / source
    return bool(recorded_sha256) and path.exists() and sha256_of(path) != recorded_sha256


def write_test_support(project: Project, tx: Transaction) -> None:
    """The package and harness the tests add-op writes import (written once, by whichever kind comes first)."""
    from backendgen.kinds import kernelgen, registration

    harness = kernelgen.render_harness(device=project.device, registration_files=registration.paths(project))
    for rel, text in ((f"{project.paths['kernel_tests']}/__init__.py", ""), (project.paths["kernel_harness"], harness)):
        if not (project.root / rel).exists():
            tx.write(project.root / rel, text)


def keyed(probed: dict | None) -> dict[str, dict[str, bool]] | None:
    """From check's probe: operator -> dispatch key -> whether the built library registers a kernel
    there; None when the library did not load."""
    load = (probed or {}).get("load") or {}
    return load.get("keyed", {}) if load.get("ok") else None


def whole_record_removal(kind: OperatorKind, project: Project, rec: Any, *, missing: str, have: str) -> list[Removal]:
    """remove-op of a record whose files are all its own (`rec.files`, led by `rec.source`); `rec` None:
    ProjectError "`missing` (`have`: what the kind has)"."""
    from backendgen.plumbing.errors import ProjectError

    if rec is None:
        raise ProjectError(f"{missing} ({have}: {', '.join(r.op for r in kind.records(project)) or 'none'})")
    return [Removal(kind, rec.source, rec.files, [rec], edited=edited(project, rec.source, rec.source_sha256))]
