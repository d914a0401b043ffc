"""A backend's own operators: `backendgen add-op <device>::<name> --schema "(...) -> ..."`.

The schema is parsed by the installed torch's `torchgen` and typed by `opdb.Op.of`, the constructor
of ATen's operators too (the dispatcher's C++ signature, each argument's and return's kind), then
one operator gets:

- `csrc/custom_ops/<name>.cpp`: `compute` (what the operator means: the `--body` expression, or an
  error naming the file), the CPU kernel and the Meta kernel (both `compute`; without a body the
  Meta kernel derives the output shape from the schema where it can), and the device kernel
  (`compute` on host aliases of the device memory, like an ATen kernel);
- with `--autograd`, `csrc/autograd/<device>_<name>.cpp`: a `torch::autograd::Function` registered
  at the `Autograd` alias key, whose backward differentiates `compute` (a team writes its formula);
- `<package>/ops/<name>.py`: the documented Python wrapper; `tests/ops/test_<device>_<name>.py`;
- its lines in the generated registration file: `m.def` and one `m.impl` per dispatch key,
  including `ADInplaceOrView` for in-place and view schemas (version counters and view metadata).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backendgen.kinds import jinja
from backendgen.plumbing.errors import UserError
from backendgen.project import manifest
from backendgen.torchdb.opdb import Arg, ArgKind, Op, ReturnKind

NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def kind_path(key: str) -> str:
    """Where the operator kinds' files live ("custom_ops", "autograd", "kernel_tests"): the installed
    template's manifest, read when a file is named (every template with own operators and overrides,
    7 on, puts them where the current one does)."""
    return manifest.load().path(key)


def is_custom_name(name: str, device: str) -> bool:
    return name.strip().startswith(f"{device}::")


@dataclass(frozen=True)
class Return:
    kind: (
        str  # "new" (a fresh tensor or a non-tensor), "mutated" (returns a (a!) argument), "view" (aliases an argument)
    )
    arg: str | None = None  # the argument it aliases


@dataclass(frozen=True)
class CustomOp:
    device: str
    name: str
    schema: str  # without the namespace: "scale(Tensor x, float alpha=1.0) -> Tensor"
    op: Op  # typed like an ATen op (namespace = the device), for kernelgen's argument handling
    returns: tuple[Return, ...]
    body: str | None = None
    autograd: bool = False
    func: object = None  # torchgen's FunctionSchema of `schema`

    @property
    def qualified(self) -> str:
        return f"{self.device}::{self.name}"

    @property
    def cpp_namespace(self) -> str:
        return f"{self.device}::custom::{self.name}"

    @property
    def source(self) -> str:
        return f"{kind_path('custom_ops')}/{self.name}.cpp"

    @property
    def autograd_source(self) -> str | None:
        return f"{kind_path('autograd')}/{self.device}_{self.name}.cpp" if self.autograd else None

    def python_module(self, package: str) -> str:
        return f"{package}/ops/{self.name}.py"

    @property
    def test(self) -> str:
        return f"{kind_path('kernel_tests')}/test_{self.device}_{self.name}.py"

    def files(self, package: str) -> list[str]:
        """Every file add-op writes for it."""
        return [self.source, *([self.autograd_source] if self.autograd else []), self.python_module(package), self.test]

    @property
    def mutates(self) -> bool:
        return any(a.is_write for a in self.op.args)

    @property
    def aliases(self) -> bool:
        return self.mutates or any(r.kind == "view" for r in self.returns)

    @property
    def keys(self) -> list[str]:
        """The dispatch keys it has kernels for."""
        keys = ["PrivateUse1", "CPU", "Meta"]
        if self.autograd:
            keys.append("Autograd")
        if self.aliases:
            keys.append("ADInplaceOrView")
        return keys

    @property
    def meta_derivable(self) -> bool:
        """Whether the Meta kernel knows the output shapes without a body: every result is a
        mutated argument or a new tensor shaped like the first tensor argument."""
        first = first_tensor(self.op)
        return all(r.kind == "mutated" or (r.kind == "new" and first is not None) for r in self.returns) and all(
            k in (ReturnKind.TENSOR, ReturnKind.TENSOR_REF) for k in self.op.return_items
        )

    @property
    def notes(self) -> list[str]:
        if any(r.kind != "new" for r in self.returns):
            return [
                f"{self.qualified} returns an alias of an argument: torch.compile cannot functionalize such a custom "
                "operator (PyTorch's limit); a mutating operator that returns nothing (-> ()) compiles"
            ]
        return []

    @property
    def kernel_names(self) -> dict[str, str]:
        """The C++ function registered for each dispatch key (ADInplaceOrView is PyTorch's own)."""
        names = {"PrivateUse1": "device_kernel", "CPU": "cpu_kernel", "Meta": "meta_kernel"}
        if self.autograd:
            names["Autograd"] = "autograd_kernel"
        return names


def first_tensor(op: Op) -> Arg | None:
    return next((a for a in op.args if a.kind.is_tensor), None)


_SUPPORTED_ARGS = re.compile(
    r"^(Tensor(\([a-z]!?\))?\??|Tensor\[\]|int|SymInt|float|bool|str|Scalar|ScalarType|Layout|Device|MemoryFormat|Generator)"
    r"(\?|\[\d*\]\??)?$"
)


_SUPPORTED_RETURNS = ("Tensor", "Tensor[]", "int", "float", "bool", "Scalar", "SymInt")


def parse(device: str, name: str, schema: str, *, body: str | None = None, autograd: bool = False) -> CustomOp:
    """Type `<device>::<name>` with `schema` ("(Tensor x, float alpha=1.0) -> Tensor") through torchgen."""
    from torchgen.local import parametrize

    bare = name.strip().removeprefix(f"{device}::")
    if not NAME.match(bare):
        raise UserError(
            f"invalid operator name {name[:80]!r}: {device}:: followed by lower-case letters, digits and _ "
            "(no overload name)"
        )
    func = _parse_schema(device, bare, schema)
    _check_arguments(func, f"{device}::{bare}")
    _check_types(func, f"{device}::{bare}")
    # own operators' kernels take plain `at::Tensor &` and `at::TensorList`, whatever the yaml says of ATen's
    with parametrize(use_const_ref_for_mutable_tensors=False, use_ilistref_for_tensor_lists=False):
        op = Op.of(
            func,
            root=bare,
            cpp_name="NAME",
            annotated_args=True,
            structured=False,
            structured_delegate=None,
            dispatch_keys=(),
            composite_implicit=False,
            composite_explicit=False,
            needs_backend_kernel=True,
            namespace=device,
        )
    custom = CustomOp(
        device=device,
        name=bare,
        schema=str(func),
        op=op,
        returns=_returns(func, f"{device}::{bare}"),
        body=_check_body(body, bare, device),
        autograd=autograd,
        func=func,
    )
    _check_shape(custom)
    return custom


def _parse_schema(device: str, bare: str, schema: str):
    """torchgen's FunctionSchema of `<bare><schema>`; the schema may repeat the name."""
    from torchgen.model import FunctionSchema

    if schema is None or not schema.strip():
        raise UserError(
            f'{device}::{bare} is a new operator: give its schema, e.g. --schema "(Tensor x, float alpha=1.0) '
            '-> Tensor"'
        )
    text = schema.strip()
    if text.startswith(bare + "("):
        text = text[len(bare) :]
    if not text.startswith("(") or any(ord(c) < 32 for c in text):
        raise UserError(f'malformed schema {schema[:80]!r}: expected "(ARGUMENTS) -> RETURNS" on one line')
    try:
        return FunctionSchema.parse(f"{bare}{text}")
    except Exception as e:  # torchgen asserts on what it rejects  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"schema of {device}::{bare} rejected by torchgen: {first[:200]}") from None


def _check_types(func, qualified: str) -> None:
    """Refuse argument and return types the generator does not support."""
    for a in func.arguments.flat_all:
        if not _SUPPORTED_ARGS.match(str(a.type)):
            raise UserError(f"{qualified}: argument {a.name} of type {a.type} is not supported by the generator yet")
    for r in func.returns:
        if str(r.type) not in _SUPPORTED_RETURNS:
            raise UserError(f"{qualified}: return type {r.type} is not supported by the generator yet")


def _returns(func, qualified: str) -> tuple[Return, ...]:
    """What each return is: new, or the argument its alias annotation names (mutated or viewed)."""
    rets = []
    by_alias = {
        str(a.annotation.alias_set[0]) if a.annotation else None: a for a in func.arguments.flat_all if a.annotation
    }
    for r in func.returns:
        if r.annotation is None:
            rets.append(Return("new"))
            continue
        arg = by_alias.get(str(r.annotation.alias_set[0]))
        if arg is None:
            raise UserError(f"{qualified}: the return's alias annotation ({r.annotation}) names no argument")
        rets.append(Return("mutated" if r.annotation.is_write else "view", arg.name))
    return tuple(rets)


def _check_shape(custom: CustomOp) -> None:
    """Refuse views PyTorch cannot track for a custom operator, and --autograd where no backward is generated."""
    rets, args, autograd = custom.returns, custom.op.args, custom.autograd
    if any(r.kind == "view" for r in rets) and (len(rets) > 1 or rets[0].arg != args[0].name):
        raise UserError(
            f"{custom.qualified}: a view must be its operator's one result, and of its first argument "
            "(what PyTorch's view tracking for custom operators supports)"
        )
    if any(r.kind == "view" for r in rets) and any(a.is_write for a in args):
        raise UserError(f"{custom.qualified}: an operator cannot both write an argument and return a view")
    if autograd and custom.aliases:
        raise UserError(
            f"{custom.qualified} mutates or returns a view of an argument: --autograd generates a backward for "
            "functional operators only (define a functional operator and differentiate that)"
        )
    if autograd and custom.op.returns != ("Tensor",):
        raise UserError(f"{custom.qualified}: --autograd generates a backward for operators that return one Tensor")
    # by kind, not spelling: torchgen spells an annotated list "Tensor[](a)"
    lists = (ArgKind.TENSOR_LIST, ArgKind.OPTIONAL_TENSOR_LIST)
    if autograd and not any(a.kind.host_aliased for a in args) and not any(a.kind in lists for a in args):
        raise UserError(f"{custom.qualified} takes no tensor: there is nothing to differentiate (drop --autograd)")
    if autograd and any(a.kind in lists for a in args):
        raise UserError(f"{custom.qualified}: --autograd does not support Tensor[] arguments yet")


def _check_body(body: str | None, name: str, device: str) -> str | None:
    if body is None:
        return None
    text = body.strip()
    if not text:
        raise UserError('--body is empty: give a C++ expression of the schema\'s arguments, e.g. "x * alpha"')
    if any(ord(c) < 32 or c == "\x7f" for c in text) or "*/" in text or "//" in text:
        raise UserError(
            f"--body of {device}::{name} must be one C++ expression on one line (no comments or control characters)"
        )
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in text:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                break
    if any(v != 0 for v in depth.values()) or text.count('"') % 2:
        raise UserError(f"--body of {device}::{name} has unbalanced brackets or quotes: {text[:80]!r}")
    return text


# --- C++ pieces -----------------------------------------------------------------------------------


def declaration(custom: CustomOp, function: str) -> str:
    """`RET function(ARGS)` with the dispatcher's types (for the registration file)."""
    return custom.op.signature.replace(" NAME(", f" {function}(", 1)


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_arguments(func, qualified: str) -> None:
    """Refuse argument names and defaults the generated Python and C++ cannot take: a name that is
    not an ASCII identifier, a Python or C++ keyword, a name used twice, a default that is not a
    value of its type (`float a=banana`)."""
    import keyword

    from backendgen.project.naming import CPP_KEYWORDS

    seen = set()
    for a in func.arguments.flat_all:
        name = a.name
        if not name.isascii() or not _IDENT.match(name):
            raise UserError(f"{qualified}: argument name {name[:40]!r} is not an ASCII identifier (letters, digits, _)")
        if keyword.iskeyword(name) or name in CPP_KEYWORDS:
            raise UserError(f"{qualified}: argument name {name!r} is a Python or C++ keyword; rename it (e.g. {name}_)")
        if name in seen:
            raise UserError(f"{qualified}: argument name {name!r} is used twice")
        seen.add(name)
        if a.default is not None:
            _check_default(qualified, name, str(a.type), a.default)


def _check_default(qualified: str, name: str, type_: str, default: str) -> None:
    import ast

    optional = type_.endswith("?")
    base = type_.rstrip("?")
    py = _python_default(default)
    try:
        value = ast.literal_eval(py)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = _NOT_A_LITERAL
    if optional and value is None:
        return
    is_list = "[" in base
    scalar = base.split("[")[0]
    allowed = {
        "int": (int,),
        "SymInt": (int,),
        "float": (int, float),
        "Scalar": (int, float),
        "bool": (bool,),
        "str": (str,),
    }.get(scalar)

    def fits(v) -> bool:
        return allowed is not None and isinstance(v, allowed) and (scalar == "bool" or not isinstance(v, bool))

    ok = fits(value) or (is_list and isinstance(value, list) and all(fits(v) for v in value))
    if not ok:
        example = {"int": "1", "SymInt": "1", "float": "1.0", "Scalar": "1", "bool": "True", "str": "'mean'"}.get(
            scalar
        )
        hint = (
            f" (e.g. {type_} {name}={example})"
            if example
            else (" (only None: make it optional)" if optional else " (this type takes no default here)")
        )
        raise UserError(
            f"{qualified}: the default of {name} ({type_}) is {default[:40]!r}, not a value of that type{hint}"
        )


_NOT_A_LITERAL = object()


def check_python(custom: CustomOp, package: str) -> None:
    """What add-op writes in Python must parse and compile; refuse before writing anything."""
    for label, text in (("wrapper", render_wrapper(custom, package)), ("test", render_test(custom, package))):
        try:
            compile(text, f"<{custom.qualified} {label}>", "exec")
        except SyntaxError as e:
            raise UserError(
                f"{custom.qualified}: the schema gives a Python {label} that does not parse ({e.msg}, "
                f"line {e.lineno}); change the argument names or defaults"
            ) from None


def _python_default(default: str | None) -> str | None:
    if default is None:
        return None
    return {"true": "True", "false": "False"}.get(default, default)


def python_params(custom: CustomOp) -> tuple[str, str]:
    """The wrapper's parameter list and the call's argument list, keyword-only args kept so."""
    func = custom.func
    params, call = [], []
    positional = list(func.arguments.flat_positional)
    for a in positional:
        d = _python_default(a.default)
        params.append(a.name if d is None else f"{a.name}={d}")
        call.append(a.name)
    kwonly = list(func.arguments.flat_kwarg_only) + list(func.arguments.out)
    if kwonly:
        params.append("*")
        for a in kwonly:
            d = _python_default(a.default)
            params.append(a.name if d is None else f"{a.name}={d}")
            call.append(f"{a.name}={a.name}")
    return ", ".join(params), ", ".join(call)


def sample_args(custom: CustomOp) -> tuple[list[str], list[str]]:
    """Python expressions of one call's positional and keyword arguments on CPU tensors (`dtype`)."""
    func = custom.func

    def value(a) -> str:
        t = str(a.type)
        if t == "Tensor":
            return "torch.randn(4, 5, dtype=dtype)"
        if t == "Tensor[]":
            return "[torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)]"
        if a.default is not None:
            return _python_default(a.default)
        if t.endswith("?"):
            return "torch.randn(4, 5, dtype=dtype)" if t == "Tensor?" else "None"
        return {"int": "2", "SymInt": "2", "float": "0.5", "bool": "False", "Scalar": "2", "str": '"mean"'}.get(
            t, "[1]" if "[" in t else "None"
        )

    positional = [value(a) for a in func.arguments.flat_positional]
    keywords = [f"{a.name}={value(a)}" for a in list(func.arguments.flat_kwarg_only) + list(func.arguments.out)]
    return positional, keywords


# --- rendering ------------------------------------------------------------------------------------

# How --autograd keeps a non-tensor argument for the backward: (what is stored, how it is read back)
_SAVED = {
    "int64_t": ("{n}", "{v}.toInt()"),
    "double": ("{n}", "{v}.toDouble()"),
    "bool": ("{n}", "{v}.toBool()"),
    "const at::Scalar &": ("{n}", "{v}.toScalar()"),
    "c10::SymInt": ("{n}", "{v}.toSymInt()"),
    "at::ScalarType": ("{n}", "{v}.toScalarType()"),
    "::std::optional<at::ScalarType>": ("{n}", "{v}.toOptional<at::ScalarType>()"),
    "::std::optional<double>": ("{n}", "{v}.toOptional<double>()"),
    "::std::optional<int64_t>": ("{n}", "{v}.toOptional<int64_t>()"),
    "c10::string_view": ("std::string({n})", "{v}.toStringRef()"),
    "at::IntArrayRef": ("{n}.vec()", "{v}.toIntVector()"),
}


def saved_argument(a: Arg, qualified: str) -> tuple[str, str]:
    """The C++ statements that keep non-tensor argument `a` in the autograd context for the
    backward, and read it back there."""
    if a.cpp_type not in _SAVED:
        raise UserError(
            f"{qualified}: --autograd cannot keep an argument of C++ type {a.cpp_type} ({a.name}) for the backward yet"
        )
    store, load = _SAVED[a.cpp_type]
    slot = f'ctx->saved_data["{a.name}"]'
    return f"{slot} = {store.format(n=a.name)};", f"const auto {a.name} = {load.format(v=slot)};"


def function_class(custom: CustomOp) -> str:
    return jinja.camel(custom.name)


def _ret_expr(custom: CustomOp, items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    if ReturnKind.TENSOR_REF in custom.op.return_items:
        return f"::std::forward_as_tuple({', '.join(items)})"
    return f"{custom.op.returns_cpp}({', '.join(items)})"


def _compute_lines(custom: CustomOp) -> list[str]:
    if custom.body is None:
        return [
            f'C10_THROW_ERROR(NotImplementedError, "{custom.qualified} is not defined yet: write compute() in '
            f'{custom.source}");'
        ]
    if custom.op.return_kind is ReturnKind.NONE:
        return [f"(void)({custom.body});"]
    if all(r.kind == "mutated" for r in custom.returns):
        return [f"(void)({custom.body});", f"return {_ret_expr(custom, [r.arg for r in custom.returns])};"]
    return [f"return {custom.body};"]


def _meta_lines(custom: CustomOp) -> tuple[list[str], bool]:
    call = ", ".join(a.name for a in custom.op.args)
    if custom.body is not None:
        return (
            [f"compute({call});"] if custom.op.return_kind is ReturnKind.NONE else [f"return compute({call});"]
        ), False
    if custom.meta_derivable:
        first = first_tensor(custom.op)
        items = [r.arg if r.kind == "mutated" else f"at::empty_like({first.name})" for r in custom.returns]
        if not items:
            return [], False
        comment = (
            f"// assumed: each new result has the shape, dtype and strides of {first.name}; change if not"
            if any(r.kind == "new" for r in custom.returns)
            else "// the results are the arguments it writes"
        )
        return [comment, f"return {_ret_expr(custom, items)};"], any(r.kind == "new" for r in custom.returns)
    return [
        f'C10_THROW_ERROR(NotImplementedError, "{custom.qualified}: write the output shapes in meta_kernel() in '
        f'{custom.source}");'
    ], False


def render_kernel(custom: CustomOp) -> str:
    from backendgen.kinds import kernelgen

    body = kernelgen.kernel_body(custom.op, callee="compute")
    views = [r for r in custom.returns if r.kind == "view"]
    if views:  # the result must stay a view of the argument's device memory, not a copy of it
        arg = views[0].arg
        body.epilogue = [line for line in body.epilogue if "result_device" not in line] + [
            # compute() ran on host aliases: its result is on the host alias's bytes, not the device address
            f"TORCH_CHECK(result.storage().data() == kernels::host_alias({arg}).storage().data(), "
            f'"{custom.qualified}: its '
            f'schema says the result is a view of {arg}, but compute() returned a new tensor");'
        ]
        body.ret = f"kernels::device_view({arg}, result)"
    meta_lines, uses_empty_like = _meta_lines(custom)
    return (
        jinja.environment()
        .get_template("custom_kernel.cpp.j2")
        .render(
            c=custom,
            device=custom.device,
            body=body,
            decl=lambda fn: declaration(custom, fn),
            compute_lines=_compute_lines(custom),
            meta_lines=meta_lines,
            meta_uses_empty_like=uses_empty_like,
            returns_value=custom.op.return_kind is not ReturnKind.NONE,
            call_args=", ".join(a.name for a in custom.op.args),
            headers=kernelgen.completing_headers(custom.op),
        )
    )


def render_autograd(custom: CustomOp) -> str:
    from backendgen.kinds import kernelgen

    op = custom.op
    saved, save_data, load_lines, leaf_lines, recompute = [], [], [], [], []
    n_saved = 0
    for i, a in enumerate(op.args):
        if a.kind.host_aliased:
            optional = a.kind is ArgKind.OPTIONAL_TENSOR
            saved.append(f"{a.name}.value_or(at::Tensor())" if optional else a.name)
            idx = n_saved
            n_saved += 1
            wants = f"ctx->needs_input_grad({i}) && saved[{idx}].defined() && saved[{idx}].is_floating_point()"
            leaf_lines += [
                f"at::Tensor {a.name} = saved[{idx}];",
                f"if ({wants}) {{",
                f"  {a.name} = {a.name}.detach().requires_grad_(true);",
                f"  wrt.push_back({a.name});",
                f"  wrt_index.push_back({i});",
                "}",
            ]
            recompute.append(
                f"{a.name}.defined() ? ::std::optional<at::Tensor>({a.name}) : ::std::nullopt" if optional else a.name
            )
        else:
            save, load = saved_argument(a, custom.qualified)
            save_data.append(save)
            load_lines.append(load)
            recompute.append(a.name)
    arg_types = [a.cpp_type for a in op.args]
    return (
        jinja.environment()
        .get_template("custom_autograd.cpp.j2")
        .render(
            c=custom,
            cls=function_class(custom),
            decl=lambda fn: declaration(custom, fn),
            decl_args=lambda fn, first: op.signature.replace(" NAME(", f" {fn}({first}, ", 1).replace(", )", ")"),
            saved=saved,
            save_data=save_data,
            load_lines=load_lines,
            leaf_lines=leaf_lines,
            nargs=len(op.args),
            recompute_args=", ".join(recompute),
            call_args=", ".join(a.name for a in op.args),
            fn_type=f"{op.returns_cpp}({', '.join(arg_types)})",
            headers=kernelgen.completing_headers(op),
        )
    )


def render_wrapper(custom: CustomOp, package: str) -> str:
    params, call = python_params(custom)
    return (
        jinja.environment()
        .get_template("custom_wrapper.py.j2")
        .render(c=custom, device=custom.device, package=package, params=params, call=call)
    )


def render_test(custom: CustomOp, package: str) -> str:
    positional, keywords = sample_args(custom)
    args = "(" + ", ".join(positional) + ("," if len(positional) == 1 else "") + ")"
    kwargs = "{" + ", ".join(f'"{k.split("=", 1)[0]}": {k.split("=", 1)[1]}' for k in keywords) + "}"
    mutated = [a.name for a in custom.op.args if a.is_write]
    view_of = next((r.arg for r in custom.returns if r.kind == "view"), None)
    return (
        jinja.environment()
        .get_template("test_custom_op.py.j2")
        .render(
            c=custom,
            device=custom.device,
            package=package,
            sample_args=args,
            sample_kwargs=kwargs,
            mutated=mutated,
            view_of=view_of,
            mutated_py=repr(mutated),
            view_of_py=repr(view_of),
            cls=function_class(custom),
        )
    )
