"""Which overload gets the kernel, and what refuses to get one."""

import pytest

from backendgen.kinds import aten_kernel, kernelgen, registration
from backendgen.plumbing.errors import CompositeOpError, UserError
from backendgen.project import manifest
from backendgen.torchdb.opdb import load_opdb

TEMPLATE_1 = manifest.load().features_of(1)  # kernel_support.h without common_device


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


@pytest.mark.parametrize(
    "name, base, list_of_views",
    [
        ("view_as_real", "self", False),
        ("view_as_complex", "self", False),
        ("unfold", "self", False),
        ("diagonal", "self", False),
        ("view.dtype", "self", False),
        ("unbind.int", "self", True),
        ("split.Tensor", "self", True),
        ("_make_dual", "primal", False),
    ],
)
def test_view_operators_get_a_view_kernel(db, name, base, list_of_views):
    plan = kernelgen.plan_kernel(db, db.resolve(name))
    assert plan.view and plan.functional is None and plan.covers == [plan.target.qualified]
    assert kernelgen.view_base(plan.target).name == base
    text = kernelgen.render_kernel(plan, device="npu", source_path="csrc/aten/ops/x.cpp", torch_version="x")
    assert plan.target.signature + " {" in text
    # the geometry from the CPU operator on a host alias; the result on the argument's storage
    assert f"at::_ops::{plan.target.ops_struct}::call(kernels::host_alias({base})" in text
    assert f"kernels::device_view({base}, " in text
    # metadata only: no stream work, no copies, no allocation
    for absent in ("StreamScope", "DeviceGuard", "to_device", "write_back", "empty_device"):
        assert absent not in text, absent
    assert (
        "for (const at::Tensor& v : views) result.push_back(kernels::device_view(self, v));" in text
    ) == list_of_views
    assert f"returns a view of `{base}`" in text
    test = kernelgen.render_test(plan, device="npu", source_path="csrc/aten/ops/x.cpp")
    compile(test, "test_x.py", "exec")
    assert f'ALIASED = "{base}"' in test and "def test_result_is_a_view_that_writes_reach" in test
    assert "def test_gradient_flows_through_the_view" in test


def test_the_view_operators_new_serves_are_derived_from_the_operator_database(db):
    """`backendgen new` gives a view kernel to each view operator with only backend kernels, one of
    them the CPU's (what the fallback would run), that the template does not register itself."""
    builtin = manifest.load().builtin_ops()
    serve, refused = kernelgen.view_ops_needing_kernels(db, builtin)
    assert {"view_as_real", "view_as_complex", "unfold"} <= set(serve)
    for name in serve:
        op = db.get(name)
        assert kernelgen.is_view(op) and "CPU" in op.dispatch_keys and name not in builtin
        assert not op.composite_implicit and not op.composite_explicit
        assert kernelgen.plan_kernel(db, op).view
    # the dispatcher runs a composite view (diagonal, unbind.int) or the template's (view, as_strided)
    for name in ("view", "as_strided", "diagonal", "unbind.int", "reshape", "view_as"):
        assert name not in serve and name not in refused, name
    # a view view_base refuses is reported with its reason, not served
    assert "nested tensor" in refused["_nested_view_from_buffer"]
    # what the template registers is never served twice
    assert "view_as_real" not in kernelgen.view_ops_needing_kernels(db, [*builtin, "aten::view_as_real"])[0]


@pytest.mark.parametrize(
    "name, hint",
    [
        ("_log_softmax_backward_data.out", "log_softmax"),
        ("native_batch_norm_backward", "batch_norm"),
        ("nll_loss_backward", "nll_loss"),
    ],
)
def test_a_backward_operators_test_looks_for_its_forward_opinfo(db, name, hint):
    # a hint no OpInfo matches makes the generated test run every OpInfo looking for samples (~50 s)
    assert hint in kernelgen.opinfo_hints(db.resolve(name))


def test_a_two_tensor_view_checks_devices_like_a_kernel(db):
    body = kernelgen.kernel_body(db.resolve("_make_dual"))
    assert body.setup == ['kernels::common_device("aten::_make_dual", kernels::CpuArgs::rejected, primal, tangent);']
    assert body.ret == "kernels::device_view(primal, view)"
    assert kernelgen.kernel_body(db.resolve("unfold")).setup == []


def test_computing_operators_get_no_view_checks(db):
    for name in ("topk", "abs.out", "mul.Tensor", "unsafe_split.Tensor"):  # unsafe_split returns Tensor[]: copies
        plan = kernelgen.plan_kernel(db, db.resolve(name))
        assert not plan.view
        test = kernelgen.render_test(plan, device="npu", source_path="x.cpp")
        assert "ALIASED" not in test and "test_result_is_a_view" not in test
        assert "device_view" not in kernelgen.render_kernel(plan, device="npu", source_path="x.cpp", torch_version="x")


@pytest.mark.parametrize(
    "name, reason",
    [
        ("_values", "no CPU kernel to compute its geometry"),  # sparse only
        ("_indices", "no CPU kernel to compute its geometry"),
        ("_nested_view_from_buffer", "nested tensor"),
    ],
)
def test_views_a_view_kernel_cannot_serve_are_refused_in_one_line(db, name, reason):
    with pytest.raises(UserError, match=reason) as e:
        kernelgen.plan_kernel(db, db.resolve(name))
    assert "\n" not in str(e.value) and db.resolve(name).qualified in str(e.value)


def test_views_are_refused_for_template_1_projects(db):
    with pytest.raises(UserError, match="view kernels need template 2"):
        kernelgen.plan_kernel(db, db.resolve("unfold"), features=TEMPLATE_1)


def test_kernel_source_uses_the_exact_signature(db):
    plan = kernelgen.plan_kernel(db, db.resolve("topk"))
    text = kernelgen.render_kernel(plan, device="npu", source_path="csrc/aten/ops/topk_values.cpp", torch_version="x")
    assert plan.target.signature + " {" in text
    assert "at::_ops::topk_values::schema topk_out_values;" in text  # declared with the dispatcher's type
    assert "#include <torch/library.h>" not in text and "m.impl(" not in text  # registered in the generated file
    # one computation body: queued, or run in place by the same launch (kernel_support writes back)
    assert "StreamScope" not in text and "write_back(" not in text and "host_alias(" not in text
    assert "return ::std::forward_as_tuple(values, indices);" in text


def test_multi_output_functional_moves_each_result_to_the_device(db):
    plan = kernelgen.plan_kernel(db, db.resolve("convolution_backward"))
    body = kernelgen.kernel_body(plan.target)
    assert body.ret.count("to_device(") == 3
    assert "::std::array<bool,3> output_mask" in plan.target.signature


def test_registration_registers_each_kernel_under_its_operator_name(db):
    plans = [kernelgen.plan_kernel(db, db.resolve(n)) for n in ("topk", "mul.Tensor")]
    entries = [kernelgen.registration_entry(p, device="npu") for p in plans]
    text = registration.render(entries, device="npu")
    assert "#include <ATen/ops/topk_ops.h>" in text and "#include <ATen/ops/mul_ops.h>" in text
    assert "namespace npu::ops::topk_values {\nat::_ops::topk_values::schema topk_out_values;\n}" in text
    assert 'm.impl("mul.out", TORCH_FN(npu::ops::mul_out::mul_out_out));' in text
    assert text.index('m.impl("mul.out"') < text.index('m.impl("topk.values"')  # sorted: stable diffs


@pytest.mark.parametrize(
    "requested, functional, cpu_class",
    [
        ("add.Tensor", "aten::add.Tensor", "at::native::structured_ufunc_add_CPU"),
        ("topk", "aten::topk", "at::native::structured_topk_out_cpu"),
        ("abs.out", None, None),  # not structured
        ("index_add", None, None),  # its meta function precomputes values for the kernel
    ],
)
def test_functional_kernel_only_where_the_cpu_class_can_serve_it(db, requested, functional, cpu_class):
    plan = kernelgen.plan_kernel(db, db.resolve(requested))
    assert plan.target.cpu_structured_class == cpu_class
    assert (plan.functional.qualified if plan.functional else None) == functional


def test_functional_kernel_decides_its_outputs_on_the_device_tensors_and_queues_the_out_kernel(db):
    plan = kernelgen.plan_kernel(db, db.resolve("topk"))
    text = kernelgen.render_kernel(plan, device="npu", source_path="csrc/aten/ops/topk_values.cpp", torch_version="x")
    # PyTorch's meta class, run on the device tensors; its outputs allocated in device memory
    assert "struct topk_meta final : at::meta::structured_topk {" in text
    assert "outputs[i] = kernels::empty_device(sizes, strides, options);" in text
    assert "#include <ATen/ops/topk_meta.h>" in text
    # SymInt k reaches the meta function as an int, by torchgen's translation
    assert "meta.meta(self, k.guard_int(__FILE__, __LINE__), dim, largest, sorted);" in text
    # the computation is queued: the CPU's out= kernel on what the launch kept, into the outputs
    assert 'kernels::launch(run_on, "aten::topk", [self = kernels::held(self), k = kernels::keep(k)' in text
    assert (
        "at::_ops::topk_values::call(self.get(), kernels::pass(k), kernels::pass(dim), kernels::pass(largest), "
        "kernels::pass(sorted), result0_h.get(), result1_h.get());"
    ) in text
    assert plan.functional.signature + " {" in text
    assert "at::_ops::topk::schema topk;" in text and "decltype(topk), at::_ops::topk::schema>" in text
    # topk's meta is not a TensorIterator: the base class must not be told of the outputs
    assert "structured_topk::set_output_raw_strided" not in text
    add = kernelgen.render_kernel(
        kernelgen.plan_kernel(db, db.resolve("add.out")), device="npu", source_path="x", torch_version="x"
    )
    assert "at::meta::structured_add_Tensor::set_output_raw_strided(i, sizes, strides, options);" in add


def test_a_project_without_queued_kernels_gets_the_cpu_class_run_on_the_calling_thread(db):
    features = frozenset(f.name for f in manifest.load().features.values() if f.since <= 10)
    plan = kernelgen.plan_kernel(db, db.resolve("topk"), features=features)
    text = kernelgen.render_kernel(plan, device="npu", source_path="csrc/aten/ops/topk_values.cpp", torch_version="x")
    assert "struct topk_kernel final : at::native::structured_topk_out_cpu {" in text
    assert "op.impl(self, k.guard_int(__FILE__, __LINE__), dim, largest, sorted, op.host[0], op.host[1]);" in text
    assert "kernels::launch" not in text and "kernels::StreamScope on_stream(run_on" in text


def test_out_kernels_check_on_meta_tensors_and_queue_their_computation(db):
    plan = kernelgen.plan_kernel(db, db.resolve("add.out"))
    text = kernelgen.render_kernel(plan, device="npu", source_path="x", torch_version="x")
    # the C++ meta function, not the dispatcher's Meta kernel (a Python registration, 100x slower);
    # queued if the output keeps its geometry or, being empty, is given the meta function's (a
    # structured CPU kernel ends with its outputs so); an output with elements to resize takes the
    # calling thread's path
    assert (
        "const bool queue = kernels::on_meta([&] { at::meta::add_outf(kernels::meta_like(self), "
        "kernels::meta_like(other), alpha, out_m); }) && kernels::resize_empty_out(out, out_m);"
    ) in text
    # one body: without a meta kernel in the installed torch, or for an output to resize, the same
    # launch runs it on the calling thread, in order (queue = false)
    assert 'kernels::launch(run_on, "aten::add.out", queue, [self = kernels::held(self)' in text
    out_kernel = text[: text.index("// ---- aten::add.Tensor")]  # add.Tensor's kernel follows
    assert out_kernel.count("at::_ops::add_out::call(") == 1
    assert "at::_ops::add_out::call(self.get(), other.get(), kernels::pass(alpha), out.get());" in out_kernel
    assert "StreamScope" not in text and "write_back(" not in text


def test_only_a_structured_out_kernel_resizes_an_empty_out_on_the_host(db):
    # its CPU kernel ends with the outputs as the meta function sized them (one that moves an output
    # meanwhile, mse_loss's, is followed by the launch's check); another out= kernel's pre-pass runs
    # the dispatcher's Meta kernel (often a Python decomposition), whose geometry the CPU kernel need
    # not follow: its resize stays on the calling thread
    both = kernelgen.queued_body(db.resolve("nll_loss_forward.output"))
    assert both.condition == (
        "kernels::resize_empty_out(output, output_m) && kernels::resize_empty_out(total_weight, total_weight_m)"
    )
    assert kernelgen.queued_body(db.resolve("abs.out")).condition == "kernels::same_geometry(out, out_m)"
    assert kernelgen.queued_body(db.resolve("add_.Tensor")).condition == "kernels::same_geometry(self, self_m)"


def test_a_random_kernel_reserves_its_draw_on_the_host_and_queues_it(db):
    op = db.resolve("_standard_gamma")
    body = kernelgen.queued_body(op)
    assert "generator = runtime::reserve(generator, run_on)" in body.captures  # in host call order
    assert body.meta_call.endswith("(kernels::meta_like(self), ::std::nullopt)")  # the pre-pass draws nothing
    assert "::std::optional<at::Generator>(generator.host())" in body.work[0]
    text = kernelgen.render_kernel(kernelgen.plan_kernel(db, op), device="npu", source_path="x", torch_version="x")
    assert "#include <runtime/generator.h>" in text and "kernels::StreamScope" not in text


def test_a_kernel_returning_a_list_lets_the_launch_fill_it_without_a_meta_kernel(db):
    body = kernelgen.queued_body(db.resolve("_foreach_add.List"))
    # held(result) on the vector itself: a launch run in place (no meta kernel) gives it the
    # operator's results, which nothing could allocate beforehand
    assert "result_h = kernels::held(result)" in body.captures
    assert body.on_host == ["::std::vector<at::Tensor> result = kernels::empty_like_meta(result_m, run_on);"]


@pytest.mark.parametrize(
    "name, queued",
    [
        ("relu", True),
        ("native_batch_norm", True),
        ("_foreach_add_.List", True),
        ("nonzero", False),  # its output's size depends on the data
        ("bernoulli_.float", True),  # its Generator? argument: the host reserves the draw
        ("native_dropout", False),  # draws from the CPU's default generator (no Generator argument)
        ("t_", False),  # metadata changed in place
        ("_local_scalar_dense", False),  # a value for the host
    ],
)
def test_kernels_the_host_must_wait_for_are_not_queued(db, name, queued):
    assert kernelgen.queued(db.resolve(name)) is queued


@pytest.mark.parametrize(
    "op, rule",
    [("add.out", "scalars"), ("topk.values", "rejected"), ("index.Tensor_out", "allowed")],
)
def test_kernels_check_devices_by_the_operators_rule(db, op, rule):
    plan = kernelgen.plan_kernel(db, db.resolve(op))
    body = kernelgen.kernel_body(plan.target)
    tensors = [a.name for a in plan.target.args if "Tensor" in a.cpp_type]
    assert body.setup[0] == (
        f'const c10::Device run_on = kernels::common_device("{plan.target.qualified}", kernels::CpuArgs::{rule}, '
        f"{', '.join(tensors)});"
    )


def test_registration_registers_the_functional_kernel_beside_the_out_kernel(db):
    plan = kernelgen.plan_kernel(db, db.resolve("add.out"))
    entries = [
        kernelgen.registration_entry(plan, device="npu"),
        kernelgen.registration_entry(plan, device="npu", op=plan.functional),
    ]
    text = registration.render(entries, device="npu")
    assert 'm.impl("add.Tensor", TORCH_FN(npu::ops::add_out::add_Tensor));' in text
    assert 'm.impl("add.out", TORCH_FN(npu::ops::add_out::add_out_out));' in text


def test_projects_from_template_1_get_kernels_their_kernel_support_can_compile(db):
    # template 1's kernel_support.h has host_alias, write_back, to_device and device_of only
    for name in ("add.out", "cat", "topk"):
        plan = kernelgen.plan_kernel(db, db.resolve(name), features=TEMPLATE_1)
        text = kernelgen.render_kernel(plan, device="npu", source_path="x", torch_version="x")
        assert "common_device" not in text and "empty_device" not in text and "_native.h" not in text
        assert "OptionalDeviceGuard guard(run_on);" in text
    cat = kernelgen.kernel_body(kernelgen.plan_kernel(db, db.resolve("cat")).target, features=TEMPLATE_1)
    assert cat.setup[:2] == [
        "at::Tensor tensors_first = tensors.size() ? *tensors.begin() : at::Tensor();",
        "const c10::Device run_on = kernels::device_of(tensors_first);",
    ]


def test_structured_operators_without_a_native_out_form_fall_back_whole(db):
    fallbacks = aten_kernel.fallback_registrations(db, {"aten::add.out", "aten::addr"}.__contains__)
    assert "native_layer_norm" in fallbacks and "addr" not in fallbacks  # CPU kernel over the composite unless native
    assert {"mse_loss", "sin", "sin_", "mul.Tensor", "mul_.Tensor"} <= set(fallbacks)
    assert "add.Tensor" not in fallbacks and "add_.Tensor" not in fallbacks  # add.out is native: they use it
    assert "sin.out" not in fallbacks  # out= forms of structured operators reach the boxed fallback anyway
    text = registration.render([], device="npu", fallbacks=fallbacks)
    assert 'm.impl("mse_loss", cpu());' in text and "makeFromBoxedFunction<&npu::fallback::run_on_cpu>" in text
