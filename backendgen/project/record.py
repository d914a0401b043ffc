"""`backendgen.json`: its one schema (every field, its type, what a stored value may be) and the
typed record the commands read and change (`Record` and the records of each operator kind).

`Record.load(data)` checks the whole parsed file against `SCHEMA` (`validate`) before any command
uses it (`Project.load` calls it once) and raises `ProjectError` naming the field, what is wrong and
the fix; then it types it. Nothing reads an unchecked value, and nothing reads the file by key. A
stored name is held to the rules a typed one is (backendgen.project.naming): a hand-edited `device`
or `package` can reach neither a C++ or Python source nor a path outside the project, and every
stored path must stay inside the project.

The schema is a small declarative model (`Field`s with a check each), not a dependency: a field is
`Str`, `Int`, `Bool`, `Obj` (named fields), `List` or `Map` (of one kind), optionally `nullable`.
Unknown top-level keys are kept and ignored (a newer backendgen may add some), and so are unknown
keys of an own operator's or an override's record (`extra`, written back); in a kernel record an
unknown key is an error (`OpRecord` is built from exactly these fields).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from backendgen.plumbing.errors import InvalidNameError, ProjectError

FORMAT = 1
RESTORE = "correct it by hand or restore backendgen.json from version control (git checkout backendgen.json)"

# what may reach a generated C++ or Python source from the file
_CPP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")
_OP = re.compile(r"^[a-z_][a-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+_-]*$")
_DIST = re.compile(r"^[a-z][a-z0-9_-]*$")
_SCHEMA_TEXT = re.compile(r"^[\x20-\x7e]*$")  # printable ASCII ...
_NOT_IN_SOURCES = set('"\\`')  # ... and nothing that ends a C++ or Python string literal


class Invalid(Exception):
    """A value that breaks the schema: `why` and, optionally, how to fix it."""

    def __init__(self, why: str, fix: str | None = None):
        super().__init__(why)
        self.why = why
        self.fix = fix


@dataclass(frozen=True)
class Kind:
    """A value's kind: `check(value)` raises Invalid."""

    name: str
    check: Callable[[object], None]
    nullable: bool = False


def _type(value, types, name) -> None:
    if isinstance(value, bool) and bool not in types:
        raise Invalid(f"expected {name}, got {_shown(value)}")
    if not isinstance(value, types):
        raise Invalid(f"expected {name}, got {_shown(value)}")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def Str(
    pattern: re.Pattern | None = None,
    *,
    what: str = "a string",
    extra: Callable[[str], None] | None = None,
    nullable: bool = False,
) -> Kind:
    def check(v):
        _type(v, (str,), "a string")
        if pattern is not None and not pattern.match(v):
            raise Invalid(f"{_shown(v)} is not {what}")
        if extra is not None:
            extra(v)

    return Kind("string", check, nullable)


def Int(lo: int | None = None, hi: int | None = None) -> Kind:
    def check(v):
        _type(v, (int,), "an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise Invalid(f"{v} is outside {lo}..{hi}")

    return Kind("integer", check)


def Bool() -> Kind:
    return Kind("boolean", lambda v: _type(v, (bool,), "true or false"))


@dataclass(frozen=True)
class F:
    """A named field of an object."""

    name: str
    kind: Kind
    required: bool = True


def Obj(*fields: F, open_: bool = False, nullable: bool = False) -> Kind:
    """An object with `fields`; `open_`: other keys are allowed (and ignored)."""

    def check(v):
        _type(v, (dict,), "an object")
        _check_fields(v, fields, open_)

    return Kind("object", check, nullable)


def List(of: Kind) -> Kind:
    def check(v):
        _type(v, (list,), "a list")
        for i, item in enumerate(v):
            _at(f"[{i}]", _label(item), lambda item=item: _value(of, item))

    return Kind("list", check)


def Map(key: Kind, value: Kind) -> Kind:
    def check(v):
        _type(v, (dict,), "an object")
        for k, item in v.items():
            _at(
                f".{k}" if _CPP_NAME.match(k) else f"[{k!r}]",
                None,
                lambda k=k, item=item: (_value(key, k), _value(value, item)),
            )

    return Kind("map", check)


class _Where(Exception):
    """Invalid, with the path of the field it is in (built up on the way out)."""

    def __init__(self, path: str, inner: Invalid):
        super().__init__(path)
        self.path = path
        self.inner = inner


def _label(item) -> str | None:
    """How a list item is named in a message: its operator, when it has one."""
    return (
        item.get("op") if isinstance(item, dict) and isinstance(item.get("op"), str) and len(item["op"]) < 80 else None
    )


def _at(step: str, label: str | None, fn) -> None:
    shown = f"{step} ({label})" if label else step
    try:
        fn()
    except Invalid as e:
        raise _Where(shown, e) from None
    except _Where as e:
        raise _Where(shown + e.path, e.inner) from None


def _value(kind: Kind, v) -> None:
    if v is None and kind.nullable:
        return
    kind.check(v)


def _check_fields(v: dict, fields: tuple[F, ...], open_: bool) -> None:
    names = {f.name for f in fields}
    missing = [f.name for f in fields if f.required and f.name not in v]
    if missing:
        raise Invalid(f"is missing {', '.join(missing)}")
    if not open_:
        extra = [k for k in v if k not in names]
        if extra:
            raise Invalid(f"has unknown field(s) {', '.join(map(repr, extra))}")
    for f in fields:
        if f.name in v:
            _at(f".{f.name}", None, lambda f=f: _value(f.kind, v[f.name]))


# --- the rules of stored values ------------------------------------------------------------------


def _device(name: str) -> None:
    from backendgen.project import naming

    try:
        naming.check_syntax(name)
    except InvalidNameError as e:
        raise Invalid(
            str(e).removeprefix("the "), "it must be the device name the project was generated with"
        ) from None
    if keyword.iskeyword(name) or name in naming.CPP_KEYWORDS:
        raise Invalid(
            f"{name!r} is a Python or C++ keyword", "it must be the device name the project was generated with"
        )


def _package(name: str) -> None:
    from backendgen.project import naming

    try:
        naming.check_syntax(name, "package name")
    except InvalidNameError as e:
        raise Invalid(
            str(e).removeprefix("the "), "it must be the project's Python package (a directory at its root)"
        ) from None
    if keyword.iskeyword(name):
        raise Invalid(f"{name!r} is a Python keyword", "it must be the project's Python package")


def _relative_path(path: str) -> None:
    """A path inside the project: relative, no `..`, printable ASCII, no backslash."""
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or not _SCHEMA_TEXT.match(path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise Invalid(f"{_shown(path)} is not a path inside the project (relative, without '..')")


def _source_text(text: str) -> None:
    """A schema, signature or expression pasted into a generated source: one line of printable ASCII
    without a quote or backslash that could end the literal it is written into."""
    if not _SCHEMA_TEXT.match(text) or _NOT_IN_SOURCES & set(text):
        raise Invalid(
            f"{_shown(text)} contains a character a generated source cannot take (quote, backslash, "
            "control or non-ASCII character)"
        )


def _body(text: str) -> None:
    if not _SCHEMA_TEXT.match(text):
        raise Invalid(f"{_shown(text)} is not one line of printable ASCII")


def _template_version(v) -> None:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).isdigit():
        raise Invalid(
            f"records an unknown template version {_shown(v)} (a number: template/template.json's "
            "template_version when the project was generated)"
        )


PATH = Str(extra=_relative_path)
OP = Str(_OP, what="an operator name (ns::name.overload)")
CPP = Str(_CPP_NAME, what="a C++ name")
HEX = Str(_HEX64, what="a lowercase hex SHA-256")
TEXT = Str(extra=_source_text)

REGISTRATION = Obj(
    F("name", CPP), F("root", CPP), F("ops_struct", CPP), F("namespace", CPP), F("function", CPP), nullable=True
)

OP_RECORD = Obj(
    F("op", OP),
    F("schema", TEXT),
    F("signature", TEXT),
    F("source", PATH),
    F("origin", Str(re.compile(r"^(template|add-op)$"), what="'template' or 'add-op'")),
    F("test", Str(extra=_relative_path, nullable=True), required=False),
    F("requested", Str(_OP, what="an operator name", nullable=True), required=False),
    F("covers", List(OP), required=False),
    F("overloads", List(OP), required=False),
    F("source_sha256", Str(_HEX64, what="a lowercase hex SHA-256", nullable=True), required=False),
    F("registration", REGISTRATION, required=False),
)

CUSTOM_OP = Obj(
    F("op", OP),
    F("schema", TEXT),
    F("body", Str(extra=_body), required=False),
    F("autograd", Bool(), required=False),
    F("signature", TEXT, required=False),
    F("source", PATH),
    F("autograd_source", PATH, required=False),
    F("python", PATH, required=False),
    F("test", PATH, required=False),
    F("source_sha256", HEX, required=False),
    open_=True,  # read by key: a field an older backendgen wrote is kept
)

OVERRIDE = Obj(
    F("op", OP),
    F("schema", TEXT),
    F("signature", TEXT, required=False),
    F("source", PATH),
    F("test", PATH, required=False),
    F("source_sha256", HEX, required=False),
    open_=True,
)

TOP_FIELDS = (
    F("format", Int()),
    F("backendgen_version", Str(_VERSION, what="a version"), required=False),
    F("template_version", Kind("template version", _template_version), required=False),
    F("template_state", HEX, required=False),  # the template state (content hash) that generated the project
    F("device", Str(extra=_device)),
    F("DEVICE", Str(re.compile(r"^[A-Z][A-Z_]*$"), what="the device name in upper case"), required=False),
    F("package", Str(extra=_package)),
    F("dist_name", Str(_DIST, what="a distribution name (lower-case letters, digits, - and _)")),
    F("num_devices", Int(1, 64), required=False),
    # the device driver it was made with (`backendgen new --driver`); absent: the emulator
    F("driver", Str(re.compile(r"^[a-z][a-z0-9_]*$"), what="a driver name (emulator, minimal)"), required=False),
    F(
        "torch",
        Obj(
            F("version", Str(_VERSION, what="a torch version, e.g. 2.9.1")),
            F("native_functions_sha256", Str(_HEX64, what="a lowercase hex SHA-256", nullable=True), required=False),
        ),
    ),
    F("ops", List(OP_RECORD)),
    F("custom_ops", List(CUSTOM_OP), required=False),
    F("autograd_overrides", List(OVERRIDE), required=False),
    F("amp", Map(CPP, Str(re.compile(r"^[a-z0-9_]+$"), what="an autocast policy")), required=False),
    F(
        "update",
        Obj(
            F("from", Kind("template version", _template_version)),
            F("to", Kind("template version", _template_version)),
            F("conflicts", List(PATH)),
            open_=True,
        ),
        required=False,
    ),
)
SCHEMA = Obj(*TOP_FIELDS, open_=True)


def validate(data: object, path: str = "backendgen.json") -> None:
    """Raise ProjectError (one line: the field, what is wrong, the fix) unless `data` fits SCHEMA."""
    if not isinstance(data, dict):
        raise ProjectError(f"{path} is malformed: expected a JSON object at the top, got {_shown(data)}; {RESTORE}")
    missing = [f.name for f in TOP_FIELDS if f.required and f.name not in data]
    if missing:
        raise ProjectError(f"{path} is missing {', '.join(missing)}; {RESTORE}")
    if data["format"] != FORMAT:
        raise ProjectError(
            f"{path} has metadata format {_shown(data['format'])}; this backendgen reads format {FORMAT}"
        )
    try:
        _value(SCHEMA, data)
    except _Where as e:
        where = e.path.removeprefix(".")
        fix = e.inner.fix or RESTORE
        verb = " " if e.inner.why.startswith(("is missing", "has unknown")) else " is malformed: "
        raise ProjectError(f"{path}: {where}{verb}{e.inner.why}; {fix}") from None
    except Invalid as e:
        raise ProjectError(f"{path} is malformed: {e.why}; {e.fix or RESTORE}") from None
    if "DEVICE" in data and data["DEVICE"] != data["device"].upper():
        raise ProjectError(
            f"{path}: DEVICE is malformed: {data['DEVICE']!r} is not the device name "
            f"{data['device']!r} in upper case; {RESTORE}"
        )


def built_entries(data: dict) -> list[str]:
    """What of a (valid) backendgen.json the built library must contain: every recorded kernel, own
    operator, autograd override and autocast policy (build.py records them after each successful
    build; backendgen.commands.consistency compares)."""
    entries = [d["op"] for d in data.get("ops", [])]
    entries += [d["op"] for d in data.get("custom_ops", [])]
    entries += [f"autograd {d['op']}" for d in data.get("autograd_overrides", [])]
    entries += [f"amp {op}={policy}" for op, policy in (data.get("amp") or {}).items()]
    return sorted(set(entries))


# --- the typed record ----------------------------------------------------------------------------
# `Record.load` validates the parsed file against SCHEMA, then types it; `Record.to_json` writes it
# back in the order its keys had (a new key after them), keeping the keys it does not know.


@dataclass(kw_only=True)
class _Typed:
    """A record read by field: the keys it does not know (`extra`) and its keys' order (`_keys`) are
    kept, so a file written back differs only where a field changed. A field set to None is left
    out, unless it may hold null (`_NULLABLE`) and the file had it (or the record is new)."""

    _NULLABLE: ClassVar[frozenset[str]] = frozenset()
    _RENAMED: ClassVar[dict[str, str]] = {}  # field -> its key in the file ("from" is a Python keyword)
    extra: dict[str, Any] = field(default_factory=dict)  # the keys this backendgen does not know
    _keys: list[str] = field(default_factory=list, repr=False, compare=False)  # the file's key order

    @classmethod
    def _key(cls, name: str) -> str:
        return cls._RENAMED.get(name, name)

    @classmethod
    def _fields(cls) -> dict[str, str]:
        """key in the file -> field name."""
        return {cls._key(f.name): f.name for f in fields(cls) if not f.name.startswith("_") and f.name != "extra"}

    @classmethod
    def from_json(cls, d: dict):
        known = cls._fields()
        values = {known[k]: cls._typed(known[k], v) for k, v in d.items() if k in known}
        obj = cls(**values, extra={k: v for k, v in d.items() if k not in known})
        obj._keys = list(d)
        return obj

    @classmethod
    def _typed(cls, name: str, value):
        return value

    def _json_value(self, name: str):
        value = getattr(self, name)
        if isinstance(value, _Typed) or isinstance(value, OpRecord):
            return value.to_json()
        if isinstance(value, list):
            return [v.to_json() if isinstance(v, (_Typed, OpRecord)) else v for v in value]
        return value

    def to_json(self) -> dict:
        known = self._fields()
        order = [*self._keys, *(k for k in known if k not in self._keys)]
        out = {}
        for key in order:
            if key in known:
                name = known[key]
                kept_null = key in self._NULLABLE and (key in self._keys or not self._keys)
                if getattr(self, name) is None and not kept_null:
                    continue
                out[key] = self._json_value(name)
            elif key in self.extra:
                out[key] = self.extra[key]
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


@dataclass
class OpRecord:
    """A kernel: one the template registers itself (origin "template") or one add-op wrote (kinds.aten_kernel)."""

    op: str  # "aten::mul.out"
    schema: str  # "aten::mul.out(Tensor self, …) -> Tensor(a!)"
    signature: str  # C++ kernel signature
    source: str  # file that registers it, relative to the project root
    origin: str  # "template" or "add-op"
    test: str | None = None
    requested: str | None = None
    covers: list[str] = field(default_factory=list)
    overloads: list[str] = field(default_factory=list)  # the base op's overloads at generation
    source_sha256: str | None = None  # as generated; a different hash means the user edited it
    registration: dict | None = None  # its line in the generated registration file (kernelgen.registration_entry)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [])}


@dataclass(kw_only=True)
class OwnOpRecord(_Typed):
    """The backend's own operator `<device>::NAME` (kinds.own_op)."""

    op: str
    schema: str  # without the namespace: "scale(Tensor x, float alpha=1.0) -> Tensor"
    body: str | None = None
    autograd: bool | None = None
    signature: str | None = None
    source: str
    autograd_source: str | None = None
    python: str | None = None
    test: str | None = None
    source_sha256: str | None = None

    @property
    def files(self) -> list[str]:
        return [f for f in (self.source, self.autograd_source, self.python, self.test) if f]


@dataclass(kw_only=True)
class OverrideRecord(_Typed):
    """An autograd override of an ATen operator (kinds.autograd_override)."""

    op: str
    schema: str
    signature: str | None = None
    source: str
    test: str | None = None
    source_sha256: str | None = None

    @property
    def files(self) -> list[str]:
        return [f for f in (self.source, self.test) if f]


@dataclass(kw_only=True)
class TorchTarget(_Typed):
    """The torch a project is made for."""

    _NULLABLE: ClassVar[frozenset[str]] = frozenset({"native_functions_sha256"})
    version: str
    native_functions_sha256: str | None = None


@dataclass(kw_only=True)
class UpdateState(_Typed):
    """An update left conflicts to resolve: from which template to which, and the files."""

    _RENAMED: ClassVar[dict[str, str]] = {"from_": "from"}
    from_: int | str
    to: int | str
    conflicts: list[str]


@dataclass(kw_only=True)
class Record(_Typed):
    """backendgen.json. Its fields in the order a new project writes them."""

    format: int = FORMAT
    backendgen_version: str | None = None
    template_version: str | int | None = None  # the template's version (a number, stored as text)
    template_state: str | None = None  # the template tree's content hash (backendgen.project.template_tree)
    device: str
    DEVICE: str | None = None
    package: str
    dist_name: str
    num_devices: int | None = None
    driver: str | None = None  # the driver it was made with (backendgen.project.drivers); None: the emulator
    torch: TorchTarget
    ops: list[OpRecord] = field(default_factory=list)
    amp: dict[str, str] | None = None  # the autocast table: operator -> policy
    custom_ops: list[OwnOpRecord] | None = None
    autograd_overrides: list[OverrideRecord] | None = None
    update: UpdateState | None = None

    _TYPES: ClassVar[dict] = {"torch": TorchTarget, "update": UpdateState}
    _LISTS: ClassVar[dict] = {"custom_ops": OwnOpRecord, "autograd_overrides": OverrideRecord}

    @classmethod
    def _typed(cls, name: str, value):
        if name in cls._TYPES and value is not None:
            return cls._TYPES[name].from_json(value)
        if name == "ops":
            return [OpRecord(**d) for d in value]
        if name in cls._LISTS:
            return [cls._LISTS[name].from_json(d) for d in value]
        return value

    @classmethod
    def load(cls, data: object, path: str = "backendgen.json") -> Record:
        """The record of a parsed backendgen.json, validated whole first (ProjectError, one line)."""
        validate(data, path)
        return cls.from_json(data)

    def built_entries(self) -> list[str]:
        return built_entries(self.to_json())
