"""Which overload gets the kernel, and what refuses to get one."""

import pytest

from backendgen import kernelgen
from backendgen.errors import CompositeOpError, UserError
from backendgen.opdb import load_opdb


@pytest.fixture(scope="module")
def db():
    return load_opdb()


@pytest.mark.parametrize(
    "requested, target, covered",
    [
        ("mul.Tensor", "aten::mul.out", {"aten::mul.Tensor", "aten::mul_.Tensor"}),
        ("add_.Tensor", "aten::add.out", {"aten::add.Tensor", "aten::add_.Tensor"}),
        ("topk", "aten::topk.values", {"aten::topk"}),
        ("cat", "aten::cat.out", {"aten::cat"}),
        ("abs.out", "aten::abs.out", set()),
        ("where.self", "aten::where.self", set()),
        ("masked_fill_.Scalar", "aten::masked_fill_.Scalar", set()),
    ],
)
def test_structured_ops_get_their_out_kernel(db, requested, target, covered):
    plan = kernelgen.plan_kernel(db, db.resolve(requested))
    assert plan.target.qualified == target
    assert set(plan.covers) == covered | {target}


def test_composite_implicit_is_refused_with_advice(db):
    with pytest.raises(CompositeOpError, match="CompositeImplicitAutograd.*decomposes"):
        kernelgen.plan_kernel(db, db.resolve("linear"))


def test_views_are_refused(db):
    with pytest.raises(UserError, match="view"):
        kernelgen.plan_kernel(db, db.resolve("unfold"))


def test_kernel_source_uses_the_exact_signature(db):
    plan = kernelgen.plan_kernel(db, db.resolve("topk"))
    text = kernelgen.render_kernel(plan, device="npu", source_path="csrc/aten/ops/topk_values.cpp", torch_version="x")
    assert plan.target.signature + " {" in text
    assert "at::_ops::topk_values::schema topk_out_values;" in text  # declared with the dispatcher's type
    assert "#include <torch/library.h>" not in text and "m.impl(" not in text  # registered in the generated file
    assert "write_back(values, values_h)" in text and "write_back(indices, indices_h)" in text
    assert "return ::std::forward_as_tuple(values, indices);" in text


def test_multi_output_functional_moves_each_result_to_the_device(db):
    plan = kernelgen.plan_kernel(db, db.resolve("convolution_backward"))
    body = kernelgen.kernel_body(plan.target)
    assert body.ret.count("to_device(") == 3
    assert "::std::array<bool,3> output_mask" in plan.target.signature


def test_registration_registers_each_kernel_under_its_operator_name(db):
    plans = [kernelgen.plan_kernel(db, db.resolve(n)) for n in ("topk", "mul.Tensor")]
    entries = [kernelgen.registration_entry(p, device="npu") for p in plans]
    text = kernelgen.render_registration(entries, device="npu")
    assert "#include <ATen/ops/topk_ops.h>" in text and "#include <ATen/ops/mul_ops.h>" in text
    assert "namespace npu::ops::topk_values {\nat::_ops::topk_values::schema topk_out_values;\n}" in text
    assert 'm.impl("mul.out", TORCH_FN(npu::ops::mul_out::mul_out_out));' in text
    assert text.index('m.impl("mul.out"') < text.index('m.impl("topk.values"')  # sorted: stable diffs
