"""From one resolved operator to a kernel source file and a test file.

`plan_kernel` decides which overload gets the kernel (for a structured op that is the out=
overload, which makes the functional, in-place and out= forms all native) and refuses operators
a kernel cannot serve (CompositeImplicitAutograd decompositions, views without a CPU kernel to
borrow the geometry from). `render_kernel` and `render_test` fill the jinja templates in
`template/ops/` with the exact C++ signature from torchgen and a body that runs the CPU kernel on
the device memory (zero-copy: the emulated device's memory is host memory). That body is where a
hardware team calls its SDK. A view operator's body (`view_body`) computes only geometry: the CPU
operator on a host alias, then `kernels::device_view` of the input. `registration_entry` is what
the generated registration file (backendgen.kinds.registration) needs to know of each kernel.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from backendgen.kinds import jinja
from backendgen.plumbing.errors import CompositeOpError, UserError
from backendgen.project import manifest
from backendgen.torchdb.opdb import Arg, ArgKind, Op, OpDB, ReturnKind

K = "kernels"  # the namespace of csrc/aten/kernel_support.h inside the device namespace


@dataclass
class KernelPlan:
    requested: Op
    target: Op  # the overload that gets the kernel
    covers: list[str]  # qualified names that become native through it
    notes: list[str] = field(default_factory=list)
    # A structured op's functional overload, when it gets a kernel of its own in the same file
    # (one shape pass, output allocated straight from the allocator) instead of PyTorch's default.
    functional: Op | None = None
    # The project's template features (manifest.features_of; None: the current template's). Without
    # `common_device` (template 1, whose kernel_support.h predates common_device and empty_device):
    # kernels of that template's shape (no device checks, no functional kernel, no view kernels).
    features: frozenset[str] | None = None
    # The target returns a view of an argument (Tensor(a) without '!'): its kernel computes only
    # geometry and returns kernels::device_view of that argument (see view_body).
    view: bool = False

    @property
    def file_stem(self) -> str:
        t = self.target
        return t.base if t.overload in ("", "out") else f"{t.base}_{t.overload}"


def _common_device(features: frozenset[str] | None) -> bool:
    return features is None or "common_device" in features


def _needs_common_device(op: Op) -> UserError:
    since = manifest.load().feature("common_device").since
    return UserError(
        f"{op.qualified} returns a view of its input; view kernels need template {since} or later (backendgen update)"
    )


def plan_kernel(db: OpDB, requested: Op, *, features: frozenset[str] | None = None) -> KernelPlan:
    """How add-op serves `requested` in a project with the template `features` (None: current)."""
    notes = []
    target = requested
    if requested.structured_delegate:
        target = db.get(requested.structured_delegate)
        if target is None:  # pragma: no cover - the yaml is self-consistent
            raise UserError(f"{requested.qualified} delegates to unknown {requested.structured_delegate}")
        notes.append(
            f"{requested.qualified} is structured: registering {target.qualified} makes "
            f"{', '.join(o.qualified for o in db.delegating_to(target))} and {target.qualified} native"
        )
    elif requested.composite_implicit:
        raise CompositeOpError(
            f"{requested.qualified} is CompositeImplicitAutograd: PyTorch decomposes it into other operators "
            "before a backend sees it, so it needs no kernel; add the operators it decomposes into instead "
            "(run it on the device with <DEVICE>_WARN_FALLBACK=1 to see which fall back to the CPU)"
        )
    view = is_view(target)
    if view:
        if not _common_device(features):
            raise _needs_common_device(target)
        view_base(target)  # refuses what a view kernel cannot serve, with the reason
    covers = [target.qualified] + [o.qualified for o in db.delegating_to(target)]
    if target.composite_explicit:
        notes.append(
            f"{target.qualified} has a CompositeExplicitAutograd kernel; the native kernel replaces it on the device"
        )
    elif not target.needs_backend_kernel and not target.structured:
        notes.append(f"{target.qualified} has a default kernel; the native kernel replaces it on the device")
    functional = None if not _common_device(features) or view else _functional(db, target)
    return KernelPlan(
        requested=requested,
        target=target,
        covers=covers,
        notes=notes,
        functional=functional,
        features=features,
        view=view,
    )


# --- view operators ------------------------------------------------------------------------------

_VIEW_RETURN = re.compile(r"\([a-z0-9_| ]+\)$")  # "Tensor(a)", "Tensor[](a)": aliases, does not write


def is_view(op: Op) -> bool:
    """Whether `op` returns a view of an argument: a return annotated with an alias set and no '!'
    (`view_as_real(Tensor(a) self) -> Tensor(a)`, `unbind.int(...) -> Tensor(a)[]`)."""
    return any(_VIEW_RETURN.search(r) for r in op.returns)


def _aliased_argument(op: Op) -> Arg | None:
    """The first argument that shares an alias set with a view return of `op`, without being written."""
    sets = {s for r in op.returns if (m := _VIEW_RETURN.search(r)) for s in m.group()[1:-1].split("|")}
    return next((a for a in op.args if not a.is_write and sets & set(a.alias_set)), None)


def view_base(op: Op):
    """The argument (opdb.Arg) whose device memory `op`'s result views, after checking that a view
    kernel can serve `op`; a UserError with the reason otherwise."""
    if op.return_kind not in (ReturnKind.TENSOR, ReturnKind.TENSOR_LIST):
        raise UserError(
            f"{op.qualified} returns {op.returns_cpp} with views in it; backendgen writes view kernels "
            "for operators returning one view (Tensor(a)) or a list of views (Tensor(a)[]) only"
        )
    if not {"CPU", "CompositeExplicitAutograd"} & set(op.dispatch_keys):
        raise UserError(
            f"{op.qualified} returns a view but has no CPU kernel to compute its geometry from "
            f"(kernels for: {', '.join(op.dispatch_keys) or 'none'}); backendgen cannot write its view kernel"
        )
    if "nested" in op.base:
        raise UserError(
            f"{op.qualified} returns a nested tensor view; backendgen writes view kernels for strided tensors only"
        )
    arg = _aliased_argument(op)
    if arg is None or arg.kind is not ArgKind.TENSOR:
        raise UserError(
            f"{op.qualified}: its result aliases no single Tensor argument; backendgen cannot write its view kernel"
        )
    return arg


def view_ops_needing_kernels(
    db: OpDB, registered: set[str] | list[str] | tuple[str, ...]
) -> tuple[list[str], dict[str, str]]:
    """The view operators of the installed torch that would reach a fresh project's CPU fallback,
    derived from the operator database (what `backendgen new` gives view kernels beside the
    template's `default_ops`): (the names view kernels serve, {name: why no view kernel can}).

    A view operator returns an alias of an input it does not write (`is_view`: a `Tensor(a)`
    return, the input `Tensor(a)`, not `a!`). It reaches the fallback when its only kernels are
    backend kernels including the CPU's: a CompositeImplicitAutograd one decomposes into other
    operators, and a CompositeExplicitAutograd one (`diagonal`, `permute`, `unbind.int`, ...) is
    what the dispatcher runs for PrivateUse1 before any backend fallback (it ends in `as_strided`,
    which the template registers); a view with no CPU kernel (sparse- or nested-only) has nothing
    the fallback could run. `registered` (names without `aten::`) are those the template registers
    itself (manifest.builtin_ops). The operators `view_base` refuses (a nested tensor result, a
    result aliasing a list) are returned with its reason instead of a name."""
    have = {n.removeprefix("aten::") for n in registered}
    serve, refused = [], {}
    for name in sorted(db.with_kernels_for("CPU")):
        op = db.get(name)
        if op is None or op.namespace != "aten" or name in have or not is_view(op):
            continue
        if op.composite_implicit or op.composite_explicit:
            continue
        try:
            view_body(op)  # refuses what a view kernel cannot serve, with the reason
        except UserError as e:
            refused[name] = str(e)
            continue
        serve.append(name)
    return serve, refused


def _functional(db: OpDB, target: Op) -> Op | None:
    """The functional overload of `target`'s structured family, if the kernel file can serve it
    directly: the CPU has a structured class for `target` to borrow the meta function and loop
    from, and the functional's arguments are plain tensors (no lists) and non-tensors."""
    if not target.cpu_structured_class:
        return None
    for op in db.delegating_to(target):
        if op.kind != "functional" or op.meta_args is None:
            continue
        plain_args = not any(a.kind.is_list for a in op.args)
        tensors_out = op.return_kind in (ReturnKind.TENSOR, ReturnKind.TUPLE_OF_TENSORS)
        if plain_args and tensors_out:
            return op
    return None


# --- the kernel body ---------------------------------------------------------------------------


@dataclass
class Body:
    setup: list[str]  # device guard (and what it needs)
    prelude: list[str]  # host aliases of the arguments
    call: str
    epilogue: list[str]  # write mutated arguments back, move new results to the device
    ret: str | None


def cpu_args(op: Op) -> str:
    """How `op` treats CPU tensors among its arguments (kernels::CpuArgs, see kernel_support.h):
    PyTorch checks ExactSame operators before their kernel; a TensorIterator checks its operands
    (CPU scalars allowed) unless the meta function first rearranges them (`index` moves CPU
    indices to the device: it precomputes); other NoCheck operators check for themselves."""
    if op.device_check == "ExactSame":
        return "rejected"
    return "scalars" if op.tensor_iterator and not op.precomputed else "allowed"


def _queued_kernels(features: frozenset[str] | None) -> bool:
    return features is None or "queued_kernels" in features


def device_setup(op: Op, *, features: frozenset[str] | None = None, stream_scope: bool = True) -> list[str]:
    """Statements that check `op`'s tensor arguments' devices and make the common one current, then
    (`stream_scope`) hold the current stream for a body run on the calling thread.

    Without the `common_device` feature (template 1's kernel_support.h has no common_device): the
    device of the first tensor argument (or of a list's first tensor), unchecked."""
    tensors = [a.name for a in op.args if a.kind.holds_tensors]
    if not tensors:
        return []
    if not _common_device(features):
        first = next((a for a in op.args if a.kind.is_tensor or a.kind is ArgKind.TENSOR_LIST), None)
        if first is None:
            return []
        lines, name = [], first.name
        if first.kind is ArgKind.TENSOR_LIST:
            name = f"{first.name}_first"
            lines.append(f"at::Tensor {name} = {first.name}.size() ? *{first.name}.begin() : at::Tensor();")
        return lines + [
            f"const c10::Device run_on = {K}::device_of({name});",
            "c10::OptionalDeviceGuard guard(run_on);",
        ]
    check = f'{K}::common_device("{op.qualified}", {K}::CpuArgs::{cpu_args(op)}, {", ".join(tensors)})'
    lines = [f"const c10::Device run_on = {check};", "c10::DeviceGuard guard(run_on);"]
    return lines + [stream_scope_line(op)] if stream_scope else lines


def stream_scope_line(op: Op) -> str:
    return f'{K}::StreamScope on_stream(run_on, "{op.qualified}");  // runs in order on the current stream'


def view_body(op: Op) -> Body:
    """C++ statements of a view operator's kernel: the CPU operator on host aliases computes the
    view's geometry (sizes, strides, storage offset, dtype), and `kernels::device_view` returns a
    device tensor with it on the aliased argument's storage. Metadata only: no data moves, and no
    stream work is queued or waited for (no StreamScope), as a view on CUDA launches nothing."""
    base = view_base(op).name
    tensors = [a.name for a in op.args if a.kind.holds_tensors]
    setup = []
    if len(tensors) > 1:  # the device check a computing kernel makes; one tensor is on its own device
        setup.append(f'{K}::common_device("{op.qualified}", {K}::CpuArgs::{cpu_args(op)}, {", ".join(tensors)});')
    prelude, call_args = [], []
    for a in op.args:
        n = a.name
        if a.kind.host_aliased:
            call_args.append(f"{K}::host_alias({n})")
        elif a.kind.is_list:
            prelude.append(f"auto {n}_h = {K}::host_alias({n});")
            call_args.append(f"{n}_h")
        else:  # a value (check_supported refused every other kind)
            call_args.append(n)
    call = f"at::_ops::{op.ops_struct}::call({', '.join(call_args)})"
    if op.return_kind is ReturnKind.TENSOR:
        return Body(setup, prelude, f"at::Tensor view = {call};", [], f"{K}::device_view({base}, view)")
    return Body(
        setup,
        prelude,
        f"::std::vector<at::Tensor> views = {call};",
        [
            "::std::vector<at::Tensor> result;",
            "result.reserve(views.size());",
            f"for (const at::Tensor& v : views) result.push_back({K}::device_view({base}, v));",
        ],
        "result",
    )


def kernel_body(
    op: Op, *, features: frozenset[str] | None = None, callee: str | None = None, stream_scope: bool = True
) -> Body:
    """C++ statements that run `op` on host aliases of the device memory (`features`: see device_setup).
    `callee`: the function run on the host aliases (default: the operator itself, through the dispatcher).
    A view operator gets `view_body`. `stream_scope`: see device_setup (a queued kernel's body, the
    path for a torch without a meta kernel, holds the stream itself)."""
    check_supported(op, features=features, callee=callee)
    if callee is None and is_view(op):
        return view_body(op)
    setup, prelude, epilogue, call_args = device_setup(op, features=features, stream_scope=stream_scope), [], [], []
    writes: list[str] = []
    device_expr = "run_on" if setup else None
    for a in op.args:
        k, n = a.kind, a.name
        if k.is_tensor:
            if a.is_write or k is ArgKind.MUTABLE_TENSOR:
                prelude.append(f"at::Tensor {n}_h = {K}::host_alias({n});")
                epilogue.append(f"{K}::write_back({n}, {n}_h);")
                writes.append(n)
                call_args.append(f"{n}_h")
            else:
                call_args.append(f"{K}::host_alias({n})")
        elif k is ArgKind.OPTIONAL_TENSOR:
            call_args.append(f"{K}::host_alias({n})")
        elif k.is_list:
            prelude.append(f"auto {n}_h = {K}::host_alias({n});")
            if a.is_write:
                epilogue.append(f"for (size_t i = 0; i < {n}.size(); ++i) {K}::write_back({n}[i], {n}_h[i]);")
            call_args.append(f"{n}_h")
        elif k is ArgKind.OPTIONAL_DEVICE:
            device_expr = f"{n}.value_or(c10::Device(c10::DeviceType::PrivateUse1))"
            call_args.append("::std::optional<at::Device>(at::kCPU)")
        elif k is ArgKind.DEVICE:  # the CPU kernel runs on host aliases: it is told the CPU
            device_expr = n
            call_args.append("at::Device(at::kCPU)")
        else:  # values (check_supported refused other tensor forms)
            call_args.append(n)
    if device_expr is None:
        device_expr = "c10::Device(c10::DeviceType::PrivateUse1)"
    to_dev = f"const c10::Device result_device = {device_expr};"  # not `device`: an argument may be named so
    call = f"{callee or f'at::_ops::{op.ops_struct}::call'}({', '.join(call_args)})"
    ret_cpp, kind = op.returns_cpp, op.return_kind
    if kind is ReturnKind.NONE:
        return Body(setup, prelude, call + ";", epilogue, None)
    if kind is ReturnKind.TENSOR_REF:
        return Body(setup, prelude, call + ";", epilogue, writes[0] if writes else None)
    if kind is ReturnKind.TUPLE_OF_REFS:
        return Body(setup, prelude, call + ";", epilogue, f"::std::forward_as_tuple({', '.join(writes)})")
    if kind is ReturnKind.TENSOR:
        return Body(
            setup,
            prelude,
            f"at::Tensor result = {call};",
            epilogue + [to_dev],
            f"{K}::to_device(result, result_device)",
        )
    if kind is ReturnKind.TENSOR_LIST:
        return Body(
            setup,
            prelude,
            f"::std::vector<at::Tensor> result = {call};",
            epilogue + [to_dev, f"for (auto& t : result) t = {K}::to_device(t, result_device);"],
            "result",
        )
    if kind in (ReturnKind.TUPLE_OF_TENSORS, ReturnKind.TUPLE):
        items = [
            f"{K}::to_device(::std::get<{i}>(result), result_device)"
            if k is ReturnKind.TENSOR
            else f"::std::get<{i}>(result)"
            for i, k in enumerate(op.return_items)
        ]
        return Body(setup, prelude, f"auto result = {call};", epilogue + [to_dev], f"{ret_cpp}({', '.join(items)})")
    return Body(setup, prelude, f"auto result = {call};", epilogue, "result")


def check_supported(op: Op, *, features: frozenset[str] | None = None, callee: str | None = None) -> None:
    """Raise UserError when kernel_body cannot write `op`'s body (an argument or return type the
    generator does not handle, a view kernel in a template without them): what add-op and profile
    ask before anything is written, without rendering the body."""
    view = callee is None and is_view(op)
    if view:
        if not _common_device(features):
            raise _needs_common_device(op)
        view_base(op)  # raises when a view kernel cannot serve it
    for a in op.args:
        if view and not (a.kind.host_aliased or a.kind.is_list or a.kind is ArgKind.VALUE):
            raise UserError(
                f"{op.qualified}: argument {a.name} of C++ type {a.cpp_type} is not supported in a view kernel yet"
            )
        if a.kind is ArgKind.OTHER_TENSOR:
            raise UserError(
                f"{op.qualified}: argument {a.name} of C++ type {a.cpp_type} is not supported by the generator yet"
            )
    if view:
        return
    kind = op.return_kind
    tuple_ok = all(k in (ReturnKind.TENSOR, ReturnKind.VALUE) for k in op.return_items)
    if kind is ReturnKind.OTHER_TENSOR or (kind in (ReturnKind.TUPLE_OF_TENSORS, ReturnKind.TUPLE) and not tuple_ok):
        raise UserError(f"{op.qualified}: return type {op.returns_cpp} is not supported by the generator yet")


# --- queued kernels ------------------------------------------------------------------------------

# Operators whose kernel the host must wait for, by their tags in native_functions.yaml: output
# sizes that depend on the data (nonzero, unique, masked_select), a value for the host (item,
# equal), metadata changed in place (t_, squeeze_), random numbers drawn from the CPU's default
# generator (an operator tagged nondeterministic_seeded without a Generator argument: nothing
# can hand its CPU kernel the device's generator). One with a `Generator?` argument is queued: the
# host reserves its offset of the device's generator (runtime::reserve), so what it draws is fixed
# by the host's call order, and the queued CPU kernel draws with the generator derived from it.
_HOST_WAITS_TAGS = {"dynamic_output_shape", "data_dependent_output", "inplace_view", "nondeterministic_seeded"}
_GENERATOR = "::std::optional<at::Generator>"
_QUEUED_RETURNS = {
    ReturnKind.NONE,
    ReturnKind.TENSOR_REF,
    ReturnKind.TUPLE_OF_REFS,
    ReturnKind.TENSOR,
    ReturnKind.TENSOR_LIST,
    ReturnKind.TUPLE_OF_TENSORS,
}
_QUEUED_ARGS = {
    ArgKind.TENSOR,
    ArgKind.MUTABLE_TENSOR,
    ArgKind.OPTIONAL_TENSOR,
    ArgKind.TENSOR_LIST,
    ArgKind.OPTIONAL_TENSOR_LIST,
    ArgKind.VALUE,
}
# What a queued kernel's closure keeps of a tensor argument (kernels::held's result type).
_HELD_TYPE = {
    ArgKind.TENSOR: "at::Tensor",
    ArgKind.MUTABLE_TENSOR: "at::Tensor",
    ArgKind.OPTIONAL_TENSOR: "::std::optional<at::Tensor>",
    ArgKind.TENSOR_LIST: "::std::vector<at::Tensor>",
    ArgKind.OPTIONAL_TENSOR_LIST: "c10::List<::std::optional<at::Tensor>>",
}


@dataclass
class QueuedBody:
    """A kernel that decides its outputs on the host and queues its computation (kernel.cpp.j2)."""

    meta_decls: list[str]  # the meta tensors of the written arguments and of the results
    meta_call: str  # the operator on meta tensors: checks the arguments, decides the outputs
    on_host: list[str]  # allocate the results, give written arguments their new geometry
    captures: list[str]  # what the queued computation keeps
    work: list[str]  # the queued computation
    ret: str | None
    condition: str = ""  # beside the pre-pass: what else must hold for the kernel to be queued
    grows: bool = False  # the condition resizes an empty out= argument on the host (structured ops)


def queued(op: Op, *, features: frozenset[str] | None = None) -> bool:
    """Whether `op`'s kernel is queued on the stream (else it runs on the calling thread)."""
    if not _queued_kernels(features) or not _common_device(features) or is_view(op):
        return False
    generators = [a for a in op.args if "Generator" in a.cpp_type]
    if any(a.cpp_type != _GENERATOR for a in generators):
        return False
    tags = set(op.tags) - ({"nondeterministic_seeded"} if generators else set())
    if _HOST_WAITS_TAGS & tags or any(a.kind not in _QUEUED_ARGS for a in op.args):
        return False
    return op.return_kind in _QUEUED_RETURNS and any(a.kind.holds_tensors for a in op.args)


@functools.lru_cache(maxsize=1)
def _aten_ops_headers() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "include" / "ATen" / "ops"
    return directory if directory.is_dir() else None


def meta_function(op: Op) -> str | None:
    """The C++ meta function of a structured operator's out= or functional overload
    (`at::meta::<root>_outf` / `at::meta::<root>`, in the installed torch's
    ATen/ops/<root>_meta_dispatch.h), if it has one. The pre-pass calls it directly: through the
    dispatcher, torch's Python meta registrations (torch/_meta_registrations.py) shadow the C++
    kernel for many operators and cost a hundred times more."""
    if op.kind == "out" and op.structured:
        suffix = "_outf"
    elif op.kind == "functional" and op.structured_delegate:
        suffix = ""
    else:
        return None
    symint = any("SymInt" in a.cpp_type for a in op.args)
    name = f"{op.root}{'_symint' if symint else ''}{suffix}"
    if f" {name}(" not in _meta_dispatch_header(op.root):
        return None
    return f"at::meta::{name}"


@functools.cache
def _meta_dispatch_header(root: str) -> str:
    """The installed torch's ATen/ops/<root>_meta_dispatch.h ("" when it has none), read once per root:
    every kernel render asks for it twice."""
    headers = _aten_ops_headers()
    header = headers / f"{root}_meta_dispatch.h" if headers is not None else None
    return header.read_text() if header is not None and header.is_file() else ""


class _QueuedArgs(NamedTuple):
    """Each argument of a queued kernel in its places (queued_body)."""

    meta_decls: list[str]  # the written arguments' meta tensors
    meta_args: list[str]  # the pre-pass's arguments
    captures: list[str]  # what the queued computation keeps
    call_args: list[str]  # the queued CPU call's arguments
    writes: list[str]  # the written tensor arguments' names


def _queued_args(op: Op) -> _QueuedArgs:
    out = _QueuedArgs([], [], [], [], [])
    for a in op.args:
        k, n = a.kind, a.name
        if k.holds_tensors:
            if a.is_write or k is ArgKind.MUTABLE_TENSOR:
                held = _HELD_TYPE[k] if k is not ArgKind.TENSOR_LIST else "::std::vector<at::Tensor>"
                out.meta_decls.append(f"{held} {n}_m = {K}::meta_like({n});")
                out.meta_args.append(f"{n}_m")
                out.writes.append(n)
            else:
                out.meta_args.append(f"{K}::meta_like({n})")
            out.captures.append(f"{n} = {K}::held({n})")
            out.call_args.append(f"{n}.get()")
        elif a.cpp_type == _GENERATOR:
            # the pre-pass draws nothing; the launch reserves the draw on the host (runtime/generator.h)
            out.meta_args.append("::std::nullopt")
            out.captures.append(f"{n} = runtime::reserve({n}, run_on)")
            out.call_args.append(f"{_GENERATOR}({n}.host())")
        else:
            out.meta_args.append(n)
            out.captures.append(f"{n} = {K}::keep({n})")
            out.call_args.append(f"{K}::pass({n})")
    return out


def queued_body(op: Op) -> QueuedBody:
    """The queued form of `op`'s kernel (call only when `queued(op)`)."""
    meta_decls, meta_args, captures, call_args, writes = _queued_args(op)
    on_host: list[str] = []
    call = f"at::_ops::{op.ops_struct}::call({', '.join(call_args)})"
    meta_call = f"{meta_function(op) or f'at::_ops::{op.ops_struct}::call'}({', '.join(meta_args)})"
    # A written argument the operator would resize: the calling thread's path (write-back follows
    # it). But a structured operator's CPU kernel ends with its outputs as its meta function sized
    # them (the C++ meta function the pre-pass calls): an empty out= argument of one is given that
    # geometry on the host, and the call is queued (`resize_empty_out`; the CPU fallback does the
    # same; a kernel that moves an output meanwhile is followed by the launch's AliasesBack::check).
    grows = op.kind == "out" and meta_function(op) is not None
    condition = " && ".join(
        f"{K}::{'resize_empty_out' if grows and a.kind.is_tensor else 'same_geometry'}({a.name}, {a.name}_m)"
        for a in op.args
        if a.name in writes
    )
    grows = grows and "resize_empty_out" in condition
    kind = op.return_kind
    if kind in (ReturnKind.NONE, ReturnKind.TENSOR_REF, ReturnKind.TUPLE_OF_REFS):
        ret = (
            None
            if kind is ReturnKind.NONE
            else writes[0]
            if kind is ReturnKind.TENSOR_REF
            else f"::std::forward_as_tuple({', '.join(writes)})"
        )
        return QueuedBody(meta_decls, meta_call, on_host, captures, [call + ";"], ret, condition, grows)
    if kind is ReturnKind.TENSOR:
        return QueuedBody(
            meta_decls + ["at::Tensor result_m;"],
            f"result_m = {meta_call}",
            on_host + [f"at::Tensor result = {K}::empty_like_meta(result_m, run_on);"],
            captures + [f"result_h = {K}::held(result)"],
            [f"{K}::copy_result(result_h.get(), {call});"],
            "result",
        )
    if kind is ReturnKind.TENSOR_LIST:
        return QueuedBody(
            meta_decls + ["::std::vector<at::Tensor> result_m;"],
            f"result_m = {meta_call}",
            on_host + [f"::std::vector<at::Tensor> result = {K}::empty_like_meta(result_m, run_on);"],
            captures + [f"result_h = {K}::held(result)"],
            [f"{K}::copy_result(result_h.get(), {call});"],
            "result",
        )
    n = len(op.return_items)  # a tuple of tensors (queued() admits no other)
    on_host = on_host + [
        f"at::Tensor result{i} = {K}::empty_like_meta(::std::get<{i}>(result_m), run_on);" for i in range(n)
    ]
    captures = captures + [f"result{i}_h = {K}::held(result{i})" for i in range(n)]
    work = [f"auto result = {call};"] + [
        f"{K}::copy_result(result{i}_h.get(), ::std::get<{i}>(result));" for i in range(n)
    ]
    return QueuedBody(
        meta_decls + [f"{op.returns_cpp} result_m;"],
        f"result_m = {meta_call}",
        on_host,
        captures,
        work,
        f"{op.returns_cpp}({', '.join(f'result{i}' for i in range(n))})",
    )


def _queued_functional(f: Op, out: Op) -> QueuedBody:
    """The queued kernel of structured functional `f`: PyTorch's meta function (`f.meta_class`) runs
    on the device tensors themselves and allocates the outputs in device memory (`meta.outputs`), as
    CUDA's structured kernels do; the queued computation is the out= operator `out` on host aliases
    (the CPU's kernel, into outputs of the right size)."""
    captures = [f"{a.name} = {K}::{'held' if a.kind.holds_tensors else 'keep'}({a.name})" for a in f.args]
    passed = {a.name: (f"{a.name}.get()" if a.kind.holds_tensors else f"{K}::pass({a.name})") for a in f.args}
    outputs = len(f.return_items)  # one tensor or a tuple of tensors (_functional)
    written = iter(range(outputs))
    out_args = [f"result{next(written)}_h.get()" if a.is_write else passed[a.name] for a in out.args]
    call = f"at::_ops::{out.ops_struct}::call({', '.join(out_args)})"
    on_host = [f"meta.meta({', '.join(f.meta_args or ())});"]
    results = [f"meta.outputs[{i}]" for i in range(outputs)]
    ret = results[0] if outputs == 1 else f"{f.returns_cpp}({', '.join(results)})"
    return QueuedBody(
        [],
        "",
        on_host,
        captures + [f"result{i}_h = {K}::held(meta.outputs[{i}])" for i in range(outputs)],
        [call + ";"],
        ret,
    )


@dataclass
class FunctionalBody:
    cls: str  # the kernel's class: the CPU structured class with device outputs
    base: str  # the CPU structured class it derives from
    tensor_iterator: bool  # the base is a TensorIterator, which must be told of each output
    outputs: int
    host_signature: str  # of the function that runs the meta function and the loop on host aliases
    host_fn: str
    meta_args: list[str]
    impl_args: list[str]
    setup: list[str]
    host_call_args: list[str]
    ret: str
    # queued (template 11 on): the launch's state (members), how it is filled (keeps), and meta's and
    # impl's arguments taken from it
    queued: bool = False
    launch: QueuedBody | None = None


def functional_body(plan: KernelPlan) -> FunctionalBody | None:
    """The parts of the functional kernel of `plan`'s structured family, if it has one."""
    f = plan.functional
    if f is None:
        return None
    outputs = len(f.return_items)  # one tensor or a tuple of tensors (_functional)
    moved = [f"std::move(op.device[{i}])" for i in range(outputs)]
    ret = moved[0] if outputs == 1 else f"{f.returns_cpp}({', '.join(moved)})"
    host_args = [f"{K}::host_alias({a.name})" if a.kind.host_aliased else a.name for a in f.args]
    host_fn = f"{f.cpp_name}_on_host"
    meta_args = list(f.meta_args or ())
    if (
        _queued_kernels(plan.features)
        and not (_HOST_WAITS_TAGS & set(f.tags))
        and f.meta_class
        and f.meta_args is not None
        and queued(plan.target, features=plan.features)
    ):
        return FunctionalBody(
            cls=f"{f.cpp_name}_meta",
            base=f.meta_class,
            tensor_iterator=plan.target.tensor_iterator,
            outputs=outputs,
            host_signature="",
            host_fn="",
            meta_args=meta_args,
            impl_args=[],
            setup=device_setup(f, stream_scope=False),
            host_call_args=[],
            ret="",
            queued=True,
            launch=_queued_functional(f, plan.target),
        )
    return FunctionalBody(
        cls=f"{f.cpp_name}_kernel",
        base=plan.target.cpu_structured_class or "",
        tensor_iterator=plan.target.tensor_iterator,
        outputs=outputs,
        host_signature=f.signature.replace(f" {f.cpp_name}(", f" {host_fn}(", 1),
        host_fn=host_fn,
        meta_args=meta_args,
        impl_args=meta_args + [f"op.host[{i}]" for i in range(outputs)],
        setup=device_setup(f),
        host_call_args=host_args,
        ret=ret,
    )


# --- rendering -----------------------------------------------------------------------------------


def _ident(s: str) -> str:
    return re.sub(r"\W", "_", s)


# Argument types that ATen/core/Tensor.h (all kernel_support.h includes) only forward-declares,
# and the header that completes each. They drag in the IValue machinery (~3 s of a compile), so
# only the kernels whose signature uses them include them.
_COMPLETING_HEADERS = {"c10::List<": "ATen/core/List.h", "ITensorListRef": "ATen/core/IListRef.h"}


def completing_headers(op: Op) -> list[str]:
    return [header for marker, header in _COMPLETING_HEADERS.items() if marker in op.signature]


def render_kernel(
    plan: KernelPlan, *, device: str, source_path: str, torch_version: str, ops_dir: Path | None = None
) -> str:
    op = plan.target
    launch = queued_body(op) if queued(op, features=plan.features) else None
    body = kernel_body(op, features=plan.features, stream_scope=launch is None)
    headers = completing_headers(op)
    functional = functional_body(plan)
    if launch is not None and meta_function(op) is not None:
        headers.append(f"ATen/ops/{op.root}_meta_dispatch.h")
    draws = launch is not None and any(a.cpp_type == _GENERATOR for a in op.args)
    if draws:
        headers.append("runtime/generator.h")  # runtime::reserve
    if functional is not None and functional.queued:
        headers.append(f"ATen/ops/{plan.functional.root}_meta.h")
    return (
        jinja.environment(ops_dir)
        .get_template("kernel.cpp.j2")
        .render(
            queued=launch,
            draws=draws,
            stream_scope=stream_scope_line(op),
            device=device,
            torch_version=torch_version,
            op=op,
            plan=plan,
            body=body,
            view_base=view_base(op).name if plan.view else None,
            headers=headers,
            functional=functional,
            namespace=_kernel_namespace(op),
            source_path=source_path,
        )
    )


def _kernel_namespace(op: Op) -> str:
    """The C++ namespace (below `<device>::ops`) of an operator's kernel: one per overload."""
    return _ident(f"{op.base}_{op.overload}" if op.overload else op.base)


def registration_entry(plan: KernelPlan, *, device: str, op: Op | None = None) -> dict:
    """What the generated registration file needs to know of one kernel of `plan`'s file (the
    target's, or `op`'s: the functional's) — stored in backendgen.json."""
    op = op or plan.target
    return {
        "name": op.name,
        "root": op.root,
        "ops_struct": op.ops_struct,
        "namespace": f"{device}::ops::{_kernel_namespace(plan.target)}",
        "function": op.cpp_name,
    }


def opinfo_hints(op: Op) -> list[str]:
    """Names of OpInfos whose samples are likely to call `op` (searched by the generated test)."""
    base = op.base.rstrip("_")
    hints = [base]
    stripped = base.lstrip("_")
    for prefix in ("native_", "_native_"):
        if stripped.startswith(prefix):
            stripped = stripped[len(prefix) :]
    for suffix in ("_backward_data", "_backward", "_forward"):  # _log_softmax_backward_data: log_softmax
        if stripped.endswith(suffix):
            stripped = stripped[: -len(suffix)]
    if stripped != base:
        hints.append(stripped)
    if stripped.startswith("convolution"):
        hints.append("conv")
    if stripped in ("index", "index_put"):
        hints.append({"index": "__getitem__", "index_put": "__setitem__"}[stripped])
    return list(dict.fromkeys(hints))


def render_test(plan: KernelPlan, *, device: str, source_path: str, ops_dir: Path | None = None) -> str:
    op = plan.target
    return (
        jinja.environment(ops_dir)
        .get_template("test_op.py.j2")
        .render(
            device=device,
            op=op,
            plan=plan,
            source_path=source_path,
            hints=opinfo_hints(op),
            backward="backward" in op.base,
            view_base=view_base(op).name if plan.view else None,
        )
    )


def render_harness(*, device: str, registration_files: list[str], ops_dir: Path | None = None) -> str:
    """tests/ops/harness.py; `registration_files`: the generated registration files (registration.paths),
    the first the registration file itself (what an older kernel template's harness names alone)."""
    return (
        jinja.environment(ops_dir)
        .get_template("harness.py.j2")
        .render(device=device, registration_file=registration_files[0], registration_files=list(registration_files))
    )
