"""What `backendgen check` reports: findings (area, severity, subject, message) and the report that
holds them. Each operator kind adds its own findings (kinds.kind.OperatorKind.check); the command
(commands/check.py) adds the rest and renders the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from backendgen.plumbing.textenum import TextEnum


class Severity(TextEnum):
    """How bad a finding is: any error (or, with --strict, a warning) fails the check."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Area(TextEnum):
    """The five areas of a check (commands/check.py's docstring)."""

    VERSIONS = "versions"
    SCHEMA = "schema"
    API = "api"
    EXTENSION = "extension"
    COVERAGE = "coverage"


class Kind(TextEnum):
    """What a finding is about (its detail's "kind"), for the code that reads findings back."""

    ABI = "abi"
    CRASH = "crash"
    CUSTOM_SCHEMA = "custom_schema"
    DANGLING = "dangling"
    DEVICE_MODULE = "device_module"
    DRIVER_INCLUDE = "driver_include"
    LOAD = "load"
    MISSING_FILE = "missing_file"
    MISSING_KERNEL = "missing_kernel"
    NEW_OVERLOADS = "new_overloads"
    PROBE = "probe"
    TESTED = "tested"
    TOO_OLD = "too_old"
    TORCH_MISMATCH = "torch_mismatch"
    UNBUILT = "unbuilt"
    UNTESTED = "untested"
    # and a schema finding's drift.Drift (unchanged, schema_changed, signature_changed, removed)


# What check itself needs of torch besides the template's extension points (the manifest's).


@dataclass
class Finding:
    area: Area
    severity: Severity
    subject: str
    message: str
    detail: dict = field(default_factory=dict)


@dataclass
class CheckReport:
    project: str
    strict: bool
    findings: list[Finding] = field(default_factory=list)
    coverage: dict = field(default_factory=dict)
    accepted: dict | None = None  # set by `check --accept` (api.check): what backendgen.json now records

    def add(self, area: Area, severity: Severity, subject: str, message: str, **detail) -> None:
        self.findings.append(Finding(area, severity, subject, message, detail))

    def of(self, area: Area) -> list[Finding]:
        return [f for f in self.findings if f.area == area]

    @property
    def errors(self) -> int:
        return sum(f.severity is Severity.ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity is Severity.WARNING for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors or (self.strict and self.warnings) else 0

    @property
    def verdict(self) -> str:
        if self.exit_code:
            return f"problems: {self.errors} error(s), {self.warnings} warning(s)"
        return "ok" + (f" ({self.warnings} warning(s))" if self.warnings else "")

    def to_json(self) -> dict:
        return {
            "project": self.project,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "errors": self.errors,
            "warnings": self.warnings,
            "findings": [asdict(f) for f in self.findings],
            "coverage": self.coverage,
            "accepted": self.accepted,
        }
