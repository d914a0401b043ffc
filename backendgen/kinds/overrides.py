"""Autograd overrides: `backendgen add-op aten::<op> --autograd` replaces PyTorch's derivative
formula for one ATen operator on the device.

It writes `csrc/autograd/<op>.cpp`, a `torch::autograd::Function` registered at
`AutogradPrivateUse1` (the generated registration file holds the `m.impl`), and
`tests/ops/test_autograd_<op>.py`, which proves the device's graph holds that Function and that its
gradients equal the CPU's. The forward runs below autograd, so the operator's inference kernel
(native or the CPU fallback) stays what it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from backendgen.kinds import jinja
from backendgen.kinds.customop import kind_path, saved_argument
from backendgen.plumbing.errors import UserError
from backendgen.torchdb.opdb import ArgKind, Op

NOTE = (
    "the override's default backward computes PyTorch's formula in host memory: eager mode only; "
    "torch.compile of a graph that differentiates {op} on the device raises until the backward in {source} "
    "is written with ATen operators"
)


@dataclass(frozen=True)
class Override:
    op: Op
    device: str

    @property
    def stem(self) -> str:
        return self.op.name.replace(".", "_")

    @property
    def source(self) -> str:
        return f"{kind_path('autograd')}/{self.stem}.cpp"

    @property
    def test(self) -> str:
        return f"{kind_path('kernel_tests')}/test_autograd_{self.stem}.py"

    @property
    def files(self) -> list[str]:
        return [self.source, self.test]

    @property
    def namespace(self) -> str:
        return f"{self.device}::autograd_overrides::{self.stem}"

    @property
    def cls(self) -> str:
        return jinja.camel(self.stem).replace("Function", "Backward")

    @property
    def declaration(self) -> str:
        return self.op.signature.replace(f" {self.op.cpp_name}(", " autograd_kernel(", 1)


def plan(op: Op, device: str) -> Override:
    """Refuse what an override cannot serve, with the reason."""
    if op.kind != "functional" or any(a.is_write for a in op.args):
        raise UserError(
            f"{op.qualified} writes its arguments: --autograd overrides the derivative of functional "
            "operators only (override the functional overload instead)"
        )
    if op.returns != ("Tensor",):
        raise UserError(
            f"{op.qualified} returns {', '.join(op.returns) or 'nothing'}: --autograd overrides "
            "operators that return one new Tensor"
        )
    for a in op.args:
        if not a.kind.host_aliased:
            saved_argument(a, op.qualified)  # refuses a type it cannot keep
    if not any(a.kind.host_aliased for a in op.args):
        raise UserError(f"{op.qualified} takes no tensor: there is nothing to differentiate")
    return Override(op, device)


def render(ov: Override, *, torch_version: str) -> str:
    from backendgen.kinds import customop, kernelgen

    op = ov.op
    saved, save_data, load_lines, leaf_lines, recompute = [], [], [], [], []
    for i, a in enumerate(op.args):
        if a.kind.host_aliased:
            optional = a.kind is ArgKind.OPTIONAL_TENSOR
            idx = len(saved)
            saved.append(f"{a.name}.value_or(at::Tensor())" if optional else a.name)
            wants = f"ctx->needs_input_grad({i}) && saved[{idx}].defined() && saved[{idx}].is_floating_point()"
            leaf_lines += [
                f"at::Tensor {a.name} = saved[{idx}].defined() ? kernels::host_alias(saved[{idx}]).detach() : "
                "at::Tensor();",
                f"if ({wants}) {{",
                f"  {a.name}.requires_grad_(true);",
                f"  wrt.push_back({a.name});",
                f"  wrt_index.push_back({i});",
                f"  saved_index.push_back({idx});",
                "}",
            ]
            recompute.append(
                f"{a.name}.defined() ? ::std::optional<at::Tensor>({a.name}) : ::std::nullopt" if optional else a.name
            )
        else:
            save, load = customop.saved_argument(a, op.qualified)
            save_data.append(save)
            load_lines.append(load)
            recompute.append(a.name)
    forward_decl = op.signature.replace(f" {op.cpp_name}(", " forward(torch::autograd::AutogradContext* ctx, ", 1)
    return (
        jinja.environment()
        .get_template("autograd_override.cpp.j2")
        .render(
            op=op,
            device=ov.device,
            torch_version=torch_version,
            namespace=ov.namespace,
            cls=ov.cls,
            source=ov.source,
            forward_decl=forward_decl,
            kernel_decl=ov.declaration,
            saved=saved,
            save_data=save_data,
            load_lines=load_lines,
            leaf_lines=leaf_lines,
            nargs=len(op.args),
            recompute_args=", ".join(recompute),
            call_args=", ".join(a.name for a in op.args),
            headers=kernelgen.completing_headers(op),
        )
    )


def render_test(ov: Override) -> str:
    from backendgen.kinds import kernelgen

    return (
        jinja.environment()
        .get_template("test_autograd_override.py.j2")
        .render(
            op=ov.op,
            device=ov.device,
            cls=ov.cls,
            source=ov.source,
            hints=kernelgen.opinfo_hints(ov.op),
        )
    )
