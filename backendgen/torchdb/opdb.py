"""Operator resolution against the installed torch.

Everything here comes from the `torchgen` package and the `native_functions.yaml` shipped in the
same torch wheel, so schemas and C++ kernel signatures match the installed torch exactly. Parsing
the yaml costs about a second, so what is derived is cached as JSON keyed by torch version and the
yaml's SHA-256. Nothing in this module imports torch itself.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backendgen.plumbing.environment import installed_torch
from backendgen.plumbing.errors import EnvironmentProblem, UnknownOpError, UserError
from backendgen.plumbing.files import sha256_of, write_atomic
from backendgen.torchdb import support

CACHE_FORMAT = 9
_OP_NAME = re.compile(r"^(?:aten::)?([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?$")


@dataclass(frozen=True)
class TorchInfo:
    version: str
    torchgen_dir: Path
    yaml_path: Path
    tags_path: Path
    yaml_sha256: str

    @property
    def public_version(self) -> str:
        return self.version.split("+", 1)[0]


def torch_info() -> TorchInfo:
    """Locate the installed torch and its torchgen without importing torch."""
    torch = installed_torch()
    if torch.torch_dir is None:
        raise EnvironmentProblem(
            f"torch is not installed in this environment (pip install torch=={support.tested()[0]})"
        )
    version = torch.version
    if version is None:
        raise EnvironmentProblem("torch is importable but has no package metadata; reinstall torch")
    tg = torch.torchgen_dir
    if tg is None:
        raise EnvironmentProblem(f"torch {version} ships no torchgen package; reinstall an official torch wheel")
    yaml_path = tg / "packaged" / "ATen" / "native" / "native_functions.yaml"
    tags_path = yaml_path.with_name("tags.yaml")
    if not yaml_path.is_file() or not tags_path.is_file():
        raise EnvironmentProblem(f"torchgen of torch {version} has no native_functions.yaml at {yaml_path}")
    sha = sha256_of(yaml_path)
    return TorchInfo(version, tg, yaml_path, tags_path, sha)


class ArgKind(str, enum.Enum):
    """What a dispatcher argument is to the code generators (kernelgen, customop, overrides), decided
    once from torchgen's C++ type (`arg_kind`); generators branch on it, never on a C++ spelling."""

    TENSOR = "tensor"  # const at::Tensor &
    MUTABLE_TENSOR = "mutable_tensor"  # at::Tensor &
    OPTIONAL_TENSOR = "optional_tensor"  # const ::std::optional<at::Tensor> &
    TENSOR_LIST = "tensor_list"  # at::TensorList, const at::ITensorListRef &
    OPTIONAL_TENSOR_LIST = "optional_tensor_list"  # const c10::List<::std::optional<at::Tensor>> &
    DEVICE = "device"  # at::Device
    OPTIONAL_DEVICE = "optional_device"  # ::std::optional<at::Device>
    OTHER_DEVICE = "other_device"  # at::DeviceIndex: passed as it is, but no view kernel takes it
    OTHER_TENSOR = "other_tensor"  # tensors in another form (::std::optional<at::Tensor> &, …): not supported
    VALUE = "value"  # numbers, Scalars, dtypes, generators, strings, …: passed as they are

    @property
    def is_tensor(self) -> bool:
        """One tensor, read or written."""
        return self in (ArgKind.TENSOR, ArgKind.MUTABLE_TENSOR)

    @property
    def host_aliased(self) -> bool:
        """One tensor or none: `kernels::host_alias(arg)` is its host alias."""
        return self.is_tensor or self is ArgKind.OPTIONAL_TENSOR

    @property
    def is_list(self) -> bool:
        return self in (ArgKind.TENSOR_LIST, ArgKind.OPTIONAL_TENSOR_LIST)

    @property
    def holds_tensors(self) -> bool:
        """Tensors a kernel checks the devices of and runs on host aliases of."""
        return self.host_aliased or self.is_list


def arg_kind(ctype) -> ArgKind:
    """The kind of a dispatcher argument of torchgen C++ type `ctype` (a `torchgen.api.types.CType`)."""
    from torchgen.api.types import (
        BaseCType,
        ConstRefCType,
        ListCType,
        MutRefCType,
        OptionalCType,
        deviceT,
        iTensorListRefT,
        tensorListT,
        tensorT,
    )

    tensor = BaseCType(tensorT)
    kinds = {
        ConstRefCType(tensor): ArgKind.TENSOR,
        MutRefCType(tensor): ArgKind.MUTABLE_TENSOR,
        ConstRefCType(OptionalCType(tensor)): ArgKind.OPTIONAL_TENSOR,
        BaseCType(tensorListT): ArgKind.TENSOR_LIST,
        ConstRefCType(BaseCType(iTensorListRefT)): ArgKind.TENSOR_LIST,
        ConstRefCType(ListCType(OptionalCType(tensor))): ArgKind.OPTIONAL_TENSOR_LIST,
        BaseCType(deviceT): ArgKind.DEVICE,
        OptionalCType(BaseCType(deviceT)): ArgKind.OPTIONAL_DEVICE,
    }
    if ctype in kinds:
        return kinds[ctype]
    spelled = ctype.cpp_type()
    if "Tensor" in spelled:
        return ArgKind.OTHER_TENSOR
    return ArgKind.OTHER_DEVICE if "Device" in spelled else ArgKind.VALUE


class ReturnKind(str, enum.Enum):
    """What an operator returns to the code generators (kernelgen, customop), decided once from
    torchgen's C++ return types: each return's (`return_item_kind`, `Op.return_items`) and the whole
    return's (`Op.return_kind`). Generators branch on it, never on a C++ spelling."""

    NONE = "none"  # void: the schema returns ()
    TENSOR = "tensor"  # at::Tensor: a new tensor (or a view of an argument)
    TENSOR_REF = "tensor_ref"  # at::Tensor &: a written argument (in-place self, out=)
    TENSOR_LIST = "tensor_list"  # ::std::vector<at::Tensor>
    TUPLE_OF_TENSORS = "tuple_of_tensors"  # ::std::tuple<at::Tensor, at::Tensor, …>
    TUPLE_OF_REFS = "tuple_of_refs"  # ::std::tuple<at::Tensor &, at::Tensor &, …>: the written out= arguments
    TUPLE = "tuple"  # any other tuple (tensors beside numbers, …): see Op.return_items
    OTHER_TENSOR = "other_tensor"  # a tensor in another form (const at::Tensor &, …): not supported
    VALUE = "value"  # numbers, Scalars, bools, …: returned as they are


def return_item_kind(ctype) -> ReturnKind:
    """The kind of one return of torchgen C++ type `ctype` (`torchgen.api.cpp.return_type`): TENSOR,
    TENSOR_REF, TENSOR_LIST, OTHER_TENSOR or VALUE."""
    from torchgen.api.types import BaseCType, MutRefCType, VectorCType, tensorT

    tensor = BaseCType(tensorT)
    kinds = {
        tensor: ReturnKind.TENSOR,
        MutRefCType(tensor): ReturnKind.TENSOR_REF,
        VectorCType(tensor): ReturnKind.TENSOR_LIST,
    }
    if ctype in kinds:
        return kinds[ctype]
    return ReturnKind.OTHER_TENSOR if "Tensor" in ctype.cpp_type() else ReturnKind.VALUE


def return_items(returns) -> tuple[ReturnKind, ...]:
    """The kinds of torchgen `returns` (a schema's `func.returns`), in the generators' current
    torchgen context (`use_const_ref_for_mutable_tensors` changes what a written tensor is)."""
    from torchgen.api import cpp

    return tuple(return_item_kind(cpp.return_type(r, symint=True)) for r in returns)


def combined_return_kind(items: tuple[ReturnKind, ...]) -> ReturnKind:
    """The kind of a whole return made of `items` (each a `return_item_kind`)."""
    if not items:
        return ReturnKind.NONE
    if len(items) == 1:
        return items[0]
    if all(k is ReturnKind.TENSOR for k in items):
        return ReturnKind.TUPLE_OF_TENSORS
    if all(k is ReturnKind.TENSOR_REF for k in items):
        return ReturnKind.TUPLE_OF_REFS
    return ReturnKind.TUPLE


@dataclass(frozen=True)
class Arg:
    name: str
    cpp_type: str  # as the dispatcher (SymInt) signature spells it
    schema_type: str  # as the schema spells it: "Tensor", "Tensor?[]", "SymInt[]", …
    is_write: bool  # the kernel mutates it (out= or in-place self)
    is_out: bool  # an out= argument
    kind: ArgKind  # what it is to a generated kernel (from cpp_type's torchgen type)
    default: str | None = None
    alias_set: tuple[str, ...] = ()  # its schema annotation's alias sets: ("a",) for Tensor(a) and Tensor(a!)

    @classmethod
    def of(cls, binding, schema_arg, *, schema_type: str, is_out: bool) -> Arg:
        """The Arg of a torchgen dispatcher `binding` and its schema argument (torchgen.model.Argument)."""
        ann = schema_arg.annotation if schema_arg is not None else None
        return cls(
            name=binding.name,
            cpp_type=binding.type,
            schema_type=schema_type,
            is_write=bool(ann is not None and ann.is_write),
            is_out=is_out,
            kind=arg_kind(binding.nctype.type),
            default=schema_arg.default if schema_arg is not None else None,
            alias_set=tuple(ann.alias_set) if ann is not None else (),
        )


@dataclass(frozen=True)
class Op:
    base: str  # "mul" ("mul_" for the in-place overloads)
    root: str  # "mul": names the ATen/ops/<root>_ops.h header
    overload: str  # "out", or "" for the default overload
    schema: str  # "mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)"
    kind: str  # functional | inplace | out | mutable | scratch
    cpp_name: str  # unique C++ kernel name, "mul_out_out"
    ops_struct: str  # the at::_ops struct, "mul_out"
    signature: str  # "at::Tensor & mul_out_out(const at::Tensor & self, …)"
    returns_cpp: str
    returns: tuple[str, ...]  # schema return types, "Tensor", "Tensor(a!)", "Tensor[]", "Scalar", …
    return_items: tuple[ReturnKind, ...]  # what each return is to a generated kernel (from torchgen's C++ type)
    args: tuple[Arg, ...]
    structured: bool
    structured_delegate: str | None
    dispatch_keys: tuple[str, ...]
    composite_implicit: bool
    composite_explicit: bool
    needs_backend_kernel: bool
    tags: tuple[str, ...] = field(default=())
    device_check: str = "ExactSame"  # "NoCheck": the kernel itself checks devices (e.g. TensorIterator)
    tensor_iterator: bool = False  # its structured meta function is a TensorIterator (CPU scalars allowed)
    precomputed: bool = False  # its structured meta function precomputes values for the kernel
    # For a structured out= overload with a CPU kernel class (not for ops whose meta precomputes
    # values for the kernel): the C++ class that runs PyTorch's meta function and the CPU loop.
    cpu_structured_class: str | None = None
    # For the functional overload of such a group: its meta function's arguments, as C++
    # expressions of the functional kernel's own parameters (torchgen's translate).
    meta_args: tuple[str, ...] | None = None
    # For that functional overload: PyTorch's meta class of its group (at::meta::structured_…, in
    # ATen/ops/<root>_meta.h), whose meta() a kernel runs on the device tensors themselves.
    meta_class: str | None = None
    namespace: str = "aten"  # a backend's own operators (backendgen.kinds.customop) live in its device's namespace

    @property
    def name(self) -> str:
        return f"{self.base}.{self.overload}" if self.overload else self.base

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def return_kind(self) -> ReturnKind:
        """What the operator returns as a whole (generators branch on it, never on `returns_cpp`)."""
        return combined_return_kind(self.return_items)

    @property
    def lacks_cpu_kernel(self) -> bool:
        """Nothing the CPU fallback could run for it: native_functions.yaml dispatches it to no CPU
        kernel and it has no composite kernel (CUDA-only operators such as `_thnn_fused_lstm_cell`,
        sparse-only, quantized-only ones). A structured overload is judged by its delegate (`sin`
        runs through `sin.out`)."""
        return (
            self.namespace == "aten"
            and not self.structured_delegate
            and "CPU" not in self.dispatch_keys
            and not self.composite_implicit
            and not self.composite_explicit
        )

    @property
    def qualified_schema(self) -> str:
        return f"{self.namespace}::{self.schema}"

    @classmethod
    def of(cls, func, *, root: str, cpp_name: str, annotated_args: bool = False, **facts) -> Op:
        """The one constructor of an operator, ATen's (`_derive_ops`) and a backend's own
        (`kinds.customop.parse`): torchgen `FunctionSchema` `func` typed as the dispatcher sees it,
        in the caller's torchgen context (`native_function_manager` for a native function, an own
        operator's `parametrize`): its name, schema, kind, `Arg`s (each `ArgKind`), returns (each
        `ReturnKind`) and C++ signature (`<returns> <cpp_name>(<args>)`). With `annotated_args`, an
        `Arg.schema_type` keeps its alias annotation ("Tensor(a!)"; own operators). `facts` are the
        rest of Op's fields: what native_functions.yaml says of it, or an own operator's namespace."""
        from torchgen.api.types import DispatcherSignature

        sig = DispatcherSignature.from_schema(func, symint=True)
        schema_args = {a.name: a for a in func.arguments.flat_all}
        out_names = {a.name for a in func.arguments.out}
        args = []
        for b in sig.arguments():
            sa = schema_args.get(b.name)
            spelled = _spelled(sa.type, sa.annotation if annotated_args else None) if sa else ""
            args.append(Arg.of(b, sa, schema_type=spelled, is_out=b.name in out_names))
        return cls(
            base=str(func.name.name),
            root=root,
            overload=func.name.overload_name,
            schema=str(func),
            kind=func.kind().name,
            cpp_name=cpp_name,
            ops_struct=func.name.unambiguous_name(),
            signature=sig.defn(name=cpp_name),
            returns_cpp=sig.returns_type().cpp_type(),
            returns=tuple(_spelled(r.type, r.annotation) for r in func.returns),
            return_items=return_items(func.returns),
            args=tuple(args),
            **facts,
        )


def _spelled(type_, annotation) -> str:
    """A schema type as the schema spells it, with its alias annotation when one is given: "Tensor(a!)"."""
    return str(type_) + (f"({annotation})" if annotation else "")


@dataclass
class _StructuredGroups:
    """What native_functions.yaml's structured groups say of their overloads, by overload name."""

    cpu_class: dict[str, str] = field(default_factory=dict)  # out= overload -> its CPU structured class
    meta_args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # functional overload -> meta() arguments
    meta_class: dict[str, str] = field(default_factory=dict)  # functional -> its group's at::meta::structured_…
    tensor_iterator: set[str] = field(default_factory=set)  # overloads whose meta function is a TensorIterator
    precomputed: set[str] = field(default_factory=set)  # overloads whose meta function precomputes kernel arguments


def _structured_groups(native_functions, cpu) -> _StructuredGroups:
    """The structured groups' facts; `cpu` is the CPU backend index (its structured kernel classes)."""
    from torchgen.api import meta as meta_api
    from torchgen.api import structured
    from torchgen.api.translate import translate
    from torchgen.api.types import DispatcherSignature
    from torchgen.context import native_function_manager
    from torchgen.gen import get_grouped_native_functions
    from torchgen.model import NativeFunctionsGroup

    s = _StructuredGroups()
    for g in get_grouped_native_functions(native_functions):
        if not isinstance(g, NativeFunctionsGroup) or not g.structured:
            continue
        if g.out.structured_inherits == "TensorIteratorBase":
            s.tensor_iterator.update(str(f.func.name) for f in g.functions())
        if g.out.precomputed is not None:
            s.precomputed.update(str(f.func.name) for f in g.functions())
            continue
        meta = cpu.get_kernel(g.out)
        if meta is None or not meta.structured:
            continue
        with native_function_manager(g.out):
            try:
                sig = DispatcherSignature.from_schema(g.functional.func, symint=True)
                args = tuple(e.expr for e in translate(list(sig.arguments()), structured.meta_arguments(g)))
            except Exception:  # noqa: BLE001, S112 - a signature translate cannot map: no functional kernel
                continue
        s.cpu_class[str(g.out.func.name)] = f"{meta.cpp_namespace}::structured_{meta.kernel}"
        s.meta_args[str(g.functional.func.name)] = args
        s.meta_class[str(g.functional.func.name)] = f"at::meta::structured_{meta_api.name(g)}"
    return s


def _native_facts(f, indices, groups: _StructuredGroups) -> dict:
    """Op's fields beyond its schema's that native_functions.yaml gives native function `f`."""
    from torchgen.gen import has_autogenerated_composite_kernel
    from torchgen.model import DeviceCheckType, DispatchKey

    implicit_only = [
        {DispatchKey.CompositeImplicitAutograd},
        {DispatchKey.CompositeImplicitAutograd, DispatchKey.CompositeImplicitAutogradNestedTensor},
    ]
    keys = {k for k, idx in indices.items() if idx.has_kernel(f)}
    name = str(f.func.name)
    return {
        "structured": bool(f.structured),
        "structured_delegate": str(f.structured_delegate) if f.structured_delegate else None,
        "dispatch_keys": tuple(sorted(str(k) for k in keys)),
        "composite_implicit": bool(f.has_composite_implicit_autograd_kernel),
        "composite_explicit": bool(
            f.has_composite_explicit_autograd_kernel or f.has_composite_explicit_autograd_non_functional_kernel
        ),
        "needs_backend_kernel": (keys not in implicit_only)
        and not (f.has_composite_kernel or has_autogenerated_composite_kernel(f)),
        "tags": tuple(sorted(f.tags)),
        "device_check": "NoCheck" if f.device_check == DeviceCheckType.NoCheck else "ExactSame",
        "tensor_iterator": name in groups.tensor_iterator,
        "precomputed": name in groups.precomputed,
        "cpu_structured_class": groups.cpu_class.get(name),
        "meta_args": groups.meta_args.get(name),
        "meta_class": groups.meta_class.get(name),
    }


def _derive_ops(info: TorchInfo) -> list[Op]:
    """Every native function of `info`'s native_functions.yaml as an Op: `Op.of` and its facts."""
    # Every torchgen name Op.of and the helpers import: a wheel without one is this one message.
    try:
        from torchgen.api import meta, native, structured  # noqa: F401
        from torchgen.api.translate import translate  # noqa: F401
        from torchgen.api.types import DispatcherSignature  # noqa: F401
        from torchgen.context import native_function_manager
        from torchgen.gen import get_grouped_native_functions, has_autogenerated_composite_kernel, parse_native_yaml  # noqa: F401
        from torchgen.model import DeviceCheckType, DispatchKey, NativeFunctionsGroup  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the torch wheel
        raise EnvironmentProblem(f"torchgen of torch {info.version} cannot be used: {e}") from None

    parsed = parse_native_yaml(str(info.yaml_path), str(info.tags_path))
    groups = _structured_groups(parsed.native_functions, parsed.backend_indices[DispatchKey.CPU])
    ops = []
    for f in parsed.native_functions:
        with native_function_manager(f):
            facts = _native_facts(f, parsed.backend_indices, groups)
            ops.append(Op.of(f.func, root=f.root_name, cpp_name=native.name(f.func), **facts))
    return ops


def cache_dir() -> Path:
    root = os.environ.get("BACKENDGEN_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "backendgen"


def _op_from_json(d: dict) -> Op:
    d = dict(d)
    d["args"] = tuple(Arg(**{**a, "kind": ArgKind(a["kind"]), "alias_set": tuple(a["alias_set"])}) for a in d["args"])
    d["return_items"] = tuple(ReturnKind(k) for k in d["return_items"])
    for k in ("returns", "dispatch_keys", "tags"):
        d[k] = tuple(d[k])
    if d.get("meta_args") is not None:
        d["meta_args"] = tuple(d["meta_args"])
    return Op(**d)


class OpDB:
    """All native functions of one torch, looked up by name."""

    def __init__(self, info: TorchInfo, ops: list[Op] | list[dict]):
        """`ops` are Ops, or their cached JSON form: an Op is then built the first time it is
        looked up (a command that resolves a few operators does not pay for all ~3000)."""
        self.info = info
        self.torch_version = info.version
        self.yaml_sha256 = info.yaml_sha256
        self._ops: dict[str, Op | dict] = {}
        self._bases: dict[str, list[str]] = {}
        self._delegating: dict[str, list[str]] = {}  # structured out= overload -> those that run through it
        for op in ops:
            base, overload, delegate = (
                (op["base"], op["overload"], op["structured_delegate"])
                if isinstance(op, dict)
                else (op.base, op.overload, op.structured_delegate)
            )
            name = f"{base}.{overload}" if overload else base  # Op.name
            self._ops[name] = op
            self._bases.setdefault(base, []).append(name)
            if delegate:
                self._delegating.setdefault(delegate, []).append(name)

    def _op(self, name: str) -> Op:
        op = self._ops[name]
        if isinstance(op, dict):
            op = self._ops[name] = _op_from_json(op)
        return op

    def __len__(self) -> int:
        return len(self._ops)

    def all(self) -> list[Op]:
        return [self._op(name) for name in self._ops]

    def required(self) -> list[Op]:
        return [op for op in self.all() if op.needs_backend_kernel]

    def overloads(self, base: str) -> list[Op]:
        return [self._op(name) for name in self._bases.get(base, [])]

    def delegating_to(self, target: Op) -> list[Op]:
        """The overloads whose structured_delegate is `target` (add.Tensor and add_.Tensor for add.out)."""
        return [self._op(name) for name in self._delegating.get(target.name, [])]

    def structured_families(self) -> dict[str, list[str]]:
        """Each structured out= overload's name -> the overloads that run through it (their
        structured_delegate): {"add.out": ["add.Tensor", "add_.Tensor"], ...}."""
        return {out: list(names) for out, names in self._delegating.items()}

    def with_kernels_for(self, *keys: str) -> list[str]:
        """Names of the overloads that have a kernel for every one of `keys` (dispatch key names)."""
        out = []
        for name, op in self._ops.items():
            have = op["dispatch_keys"] if isinstance(op, dict) else op.dispatch_keys
            if all(k in have for k in keys):
                out.append(name)
        return out

    def missing_cpu_kernel(self, op: Op) -> Op | None:
        """The operator without a CPU kernel (Op.lacks_cpu_kernel) that running `op` on the CPU would
        need: `op` itself, or, for an out= overload with no CPU kernel of its own, the functional
        overload its composite kernel calls (`_thnn_fused_lstm_cell.out` -> `_thnn_fused_lstm_cell`,
        the out= forms `autogen` adds). None if the CPU can run it."""
        if op.lacks_cpu_kernel:
            return op
        if op.kind == "out" and "CPU" not in op.dispatch_keys and not op.structured_delegate:
            return next((o for o in self.overloads(op.base) if o.kind == "functional" and o.lacks_cpu_kernel), None)
        return None

    def get(self, name: str) -> Op | None:
        m = _OP_NAME.match(name.strip()) if len(name) <= 200 else None
        if not m:
            return None
        base, overload = m.group(1), m.group(2) or ""
        if overload == "default":
            overload = ""
        key = f"{base}.{overload}" if overload else base
        return self._op(key) if key in self._ops else None

    def close_matches(self, name: str, n: int = 5) -> list[str]:
        name = name.strip()[:200]
        if name.startswith("aten::"):
            name = name[len("aten::") :]
        base = name.split(".", 1)[0]
        hits = list(self._bases.get(base, []))
        if not hits:
            hits = difflib.get_close_matches(name, list(self._ops), n=n, cutoff=0.6)
            for b in difflib.get_close_matches(base, list(self._bases), n=3, cutoff=0.75):
                hits += [op_name for op_name in self._bases[b] if op_name not in hits]
        return hits[:n]

    def resolve(self, name: str) -> Op:
        if not isinstance(name, str) or not name.strip():
            raise UserError("empty operator name")
        if len(name) > 200:
            raise UserError(f"operator name too long ({len(name)} characters)")
        if not _OP_NAME.match(name.strip()):
            raise UserError(
                f"malformed operator name {name[:80]!r}: expected aten::NAME.OVERLOAD, NAME.OVERLOAD or NAME"
            )
        op = self.get(name)
        if op is not None:
            return op
        stripped = name.strip().removeprefix("aten::")
        if "." not in stripped and self.overloads(stripped):
            # A bare name means the default overload; without one, the Tensor overload is the
            # primary one by PyTorch's convention (mul -> mul.Tensor). Anything else is ambiguous.
            if f"{stripped}.Tensor" in self._ops:
                return self._op(f"{stripped}.Tensor")
            names = ", ".join(o.name for o in self.overloads(stripped)[:8])
            raise UserError(f"{stripped!r} has no default overload; name one of: {names}")
        raise UnknownOpError(name.strip(), self.close_matches(name))


_MEMO: dict[str, OpDB] = {}


def load_opdb(info: TorchInfo | None = None) -> OpDB:
    """The operator database of the installed torch (cached on disk and in memory)."""
    info = info or torch_info()
    key = f"{info.version}-{info.yaml_sha256[:16]}"
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"opdb-v{CACHE_FORMAT}-{key}.json"
    ops = None
    if path.is_file():
        try:
            ops = json.loads(path.read_text())["ops"]
            if not all(
                isinstance(d, dict)
                and isinstance(d.get("base"), str)
                and isinstance(d.get("overload"), str)
                and "structured_delegate" in d
                for d in ops
            ):
                ops = None
        except (ValueError, KeyError, TypeError):
            ops = None  # a corrupt cache is rebuilt
    if ops is None:
        ops = _derive_ops(info)
        try:
            write_atomic(
                path, json.dumps({"torch": info.version, "sha256": info.yaml_sha256, "ops": [asdict(o) for o in ops]})
            )
        except OSError:
            pass  # an unwritable cache only costs time
    db = OpDB(info, ops)
    _MEMO[key] = db
    return db
