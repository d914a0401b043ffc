"""The device keeps PyTorch's semantics where a backend most easily loses them: writes into views,
out= into non-contiguous tensors, arguments an operator writes without saying so, and seeding.

Each test is a regression test for one root cause (csrc/aten/minimal_ops.cpp's resize_,
csrc/aten/fallback.cpp's staging and write-back, its use of the device generators); the operators
used here have no {{ cookiecutter.device }} kernel, so they run through the CPU fallback. The
conformance suite (tests/conformance, `backendgen test --opinfo`) checks the same for every operator.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import DEVICE


def both(cpu: torch.Tensor):
    """The CPU tensor and a device copy of it."""
    return cpu, cpu.to(DEVICE)


def assert_same(device_tensor: torch.Tensor, cpu_tensor: torch.Tensor):
    assert device_tensor.device.type == DEVICE
    assert device_tensor.shape == cpu_tensor.shape and device_tensor.stride() == cpu_tensor.stride()
    assert device_tensor.storage_offset() == cpu_tensor.storage_offset()
    torch.testing.assert_close(device_tensor.cpu(), cpu_tensor, equal_nan=True, rtol=0, atol=0)


def test_resize_to_the_same_size_keeps_strides():
    x, d = both(torch.arange(12.0).reshape(3, 4))
    for t in (x, d):
        view = t.t()
        view.resize_(4, 3)  # same size: PyTorch keeps the transposed strides
        assert view.stride() == (1, 4)
        t.resize_(2, 2)  # a new size: contiguous, the storage keeps its contents
        assert t.stride() == (2, 1)
    assert_same(d, x)
    grown_cpu, grown = both(torch.arange(3.0))
    for t in (grown_cpu, grown):
        t.resize_(5)
    torch.testing.assert_close(grown.cpu()[:3], grown_cpu[:3])  # old contents kept when the storage grows


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda t: t.diagonal().fill_(1), id="diagonal-fill_"),
        pytest.param(lambda t: t[:, 1].neg_(), id="column-neg_"),
        pytest.param(lambda t: t.t().index_add_(0, torch.tensor([0, 2], device=t.device), torch.ones(2, 3, device=t.device)),
                     id="transposed-index_add_"),
        pytest.param(lambda t: t[1:, ::2].exp_(), id="offset-strided-exp_"),
        pytest.param(lambda t: t.as_strided((2, 2), (1, 1), 1).add_(1), id="overlapping-add_"),
    ],
)
def test_in_place_writes_into_views_reach_the_base(write):
    x, d = both(torch.arange(12.0).reshape(3, 4) / 7)
    cpu_view, dev_view = write(x), write(d)
    assert_same(d, x)  # the whole base, elements outside the view included
    assert_same(dev_view, cpu_view)  # and the view keeps its geometry


def test_out_into_a_non_contiguous_output_writes_only_the_view():
    buf, dbuf = both(torch.full((30,), -7.0))
    src, dsrc = both(torch.randn(3, 4))
    out, dout = (b[2:].as_strided((3, 4), (1, 5), 3) for b in (buf, dbuf))
    torch.sin(src, out=out)
    torch.sin(dsrc, out=dout)
    assert_same(dbuf, buf)
    assert_same(dout, out)


def test_out_that_aliases_an_input():
    x, d = both(torch.randn(4, 4))
    for t in (x, d):
        torch.atan2(t[0], t[1], out=t[1])  # atan2 has no device kernel: the fallback
    assert_same(d, x)


def test_batch_norm_updates_running_statistics():
    # native_batch_norm writes running_mean/var in place although its schema does not mark them
    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm1d(4).train()
    dev = torch.nn.BatchNorm1d(4).train().to(DEVICE)
    for _ in range(3):
        x = torch.randn(8, 4)
        torch.testing.assert_close(dev(x.to(DEVICE)).cpu(), cpu(x))
    torch.testing.assert_close(dev.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(dev.running_var.cpu(), cpu.running_var)
    assert int(dev.num_batches_tracked) == 3
    assert not torch.equal(cpu.running_mean, torch.zeros(4))  # the statistics really moved


def _prims_run_by(fn) -> int:
    with torch.profiler.profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("prims::"))


def test_batch_norm_decides_each_geometry_once_and_matches_the_cpu_on_every_call():
    # torch's meta function for native_batch_norm, which decides the outputs on the host, is a Python
    # decomposition (prims, milliseconds a call): csrc/aten/batch_norm.cpp runs it once per geometry
    # of the arguments and reuses what it decided. Every call still matches the CPU, and a new
    # geometry (here: another layout or mode) is decided anew.
    torch.manual_seed(0)
    weight, bias = torch.randn(7), torch.randn(7)
    for memory_format in (torch.contiguous_format, torch.channels_last):
        for training in (True, False):
            x = torch.randn(3, 7, 5, 2).to(memory_format=memory_format)  # a shape no other test uses
            stats = (torch.randn(7), torch.rand(7) + 0.5)

            def run(device, x=x, stats=stats, training=training):
                args = [t.to(device, copy=True) for t in (x, weight, bias, *stats)]  # each call from the same stats
                out = torch.native_batch_norm(*args, training, 0.1, 1e-5)
                return out, args[3:]

            expected, cpu_stats = run("cpu")
            decided = []
            for _ in range(2):  # the first call decides, the second reuses
                decided.append(_prims_run_by(lambda: run(DEVICE)))
                got, dev_stats = run(DEVICE)
                for g, e in zip(got, expected, strict=True):
                    assert g.shape == e.shape
                    torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)
                assert got[0].stride() == expected[0].stride()
            assert decided[0] > 0 and decided[1] == 0, decided
            for d, c in zip(dev_stats, cpu_stats, strict=True):  # the running statistics, updated in training
                torch.testing.assert_close(d.cpu(), c)


@pytest.mark.parametrize("pointwise", [False, True], ids=["untagged", "pointwise"])
def test_an_undeclared_write_comes_back_unless_the_operator_is_tagged_pointwise(pointwise):
    # To find writes a schema does not declare, the fallback keeps each argument's staged bytes and
    # compares them after the CPU kernel. An operator tagged pointwise writes only its outputs (the
    # tag's definition), so the fallback spares it that copy and comparison: a kernel that breaks the
    # tag's promise has its stray write dropped on the device.
    ns = f"{DEVICE}_scribble_{'pointwise' if pointwise else 'untagged'}"
    lib = torch.library.Library(ns, "DEF")
    lib.define("scribble(Tensor x) -> Tensor", tags=(torch.Tag.pointwise,) if pointwise else ())

    def scribble(x):
        x[0] = 42.0  # a write the schema does not mark
        return x + 1

    lib.impl("scribble", scribble, "CPU")
    d = torch.zeros(4, device=DEVICE)
    out = getattr(torch.ops, ns).scribble(d)
    assert out.device.type == DEVICE and out.cpu().tolist() == [43.0, 1.0, 1.0, 1.0]
    assert d.cpu().tolist() == ([0.0] * 4 if pointwise else [42.0, 0.0, 0.0, 0.0])


def test_a_view_returned_by_the_fallback_aliases_its_input():
    x, d = both(torch.arange(10.0))
    cpu_view, dev_view = x.unfold(0, 4, 2), d.unfold(0, 4, 2)  # unfold is a view op with a CPU kernel
    assert_same(dev_view, cpu_view)
    dev_view[0, 1] = 100.0
    assert d[1].item() == 100.0


@pytest.mark.parametrize(
    "draw",
    [
        pytest.param(lambda t, g: t.cauchy_(generator=g), id="cauchy_"),
        pytest.param(lambda t, g: t.log_normal_(generator=g), id="log_normal_"),
        pytest.param(lambda t, g: t.geometric_(0.3, generator=g), id="geometric_"),
        pytest.param(lambda t, g: torch.multinomial(t.abs() + 0.1, 3, generator=g), id="multinomial"),
        pytest.param(lambda t, g: torch.poisson(t.abs(), generator=g), id="poisson"),
        pytest.param(lambda t, g: F.dropout(t, 0.5) if g is None else pytest.skip("dropout takes no generator"),
                     id="dropout"),
    ],
)
@pytest.mark.parametrize("explicit_generator", [False, True], ids=["default-generator", "device-generator"])
def test_random_operators_that_fall_back_use_the_device_generator(draw, explicit_generator, mod):
    base = torch.rand(64) + 0.5

    def run(seed):
        if explicit_generator:
            g = torch.Generator(device=DEVICE).manual_seed(seed)
        else:
            mod.manual_seed(seed)
            g = None
        return draw(base.to(DEVICE), g).cpu()

    first, again, other = run(3), run(3), run(4)
    torch.testing.assert_close(first, again, rtol=0, atol=0)  # the seed reproduces the draws
    assert not torch.equal(first, other)
    # the device generator is the CPU's engine: the same seed draws what the CPU draws
    cpu_gen = torch.Generator().manual_seed(3)
    if explicit_generator:
        expected = draw(base.clone(), cpu_gen)
    else:
        torch.manual_seed(3)
        expected = draw(base.clone(), None)
    torch.testing.assert_close(first, expected, rtol=0, atol=0)


def test_random_fallback_does_not_disturb_the_cpu_generator(mod):
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    mod.manual_seed(5)
    torch.empty(8, device=DEVICE).cauchy_()
    torch.testing.assert_close(torch.rand(4), expected, rtol=0, atol=0)


def test_loss_functions_warn_as_little_as_on_the_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    dev_lin = torch.nn.Linear(4, 2).to(DEVICE)
    dev_lin.load_state_dict(lin.state_dict())
    for loss in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss):
        with warnings.catch_warnings(record=True) as cpu_warnings:
            warnings.simplefilter("always")
            expected = loss(lin(x), y)
        with warnings.catch_warnings(record=True) as dev_warnings:
            warnings.simplefilter("always")
            got = loss(dev_lin(x.to(DEVICE)), y.to(DEVICE))
        assert [str(w.message) for w in dev_warnings] == [str(w.message) for w in cpu_warnings], loss.__name__
        torch.testing.assert_close(got.cpu(), expected)


def test_fallback_reports_calls_and_time(mod):
    d = torch.randn(100, device=DEVICE)
    mod.reset_fallback_counts()
    for _ in range(3):
        torch.erf(d)
    calls, seconds = mod.fallback_stats()["aten::erf"]  # structured: erf falls back whole, not erf.out
    assert calls == 3 and seconds > 0
    assert mod.fallback_counts()["aten::erf"] == 3


def test_an_efficient_zero_tensor_from_the_cpu_becomes_device_zeros():
    # autograd's formula for sgn on real numbers returns an efficient zero tensor (no memory)
    x = torch.randn(5, device=DEVICE, requires_grad=True)
    x.sgn().sum().backward()
    assert x.grad.device.type == DEVICE and torch.equal(x.grad.cpu(), torch.zeros(5))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no MKL-DNN")
def test_a_result_of_a_layout_the_device_lacks_is_a_clear_error():
    # sparse results come back as device sparse tensors (tests/test_sparse.py); an MKL-DNN one cannot
    with pytest.raises(RuntimeError, match="supports strided and sparse tensors only.*aten::to_mkldnn.*Mkldnn"):
        torch.ones(3, 3, device=DEVICE).to_mkldnn()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda x, out: torch.mode(x, 1, out=out), id="mode.values"),
        pytest.param(lambda x, out: torch.dot(x[0], x[1], out=out[0]), id="dot.out"),
    ],
)
def test_an_out_form_whose_composite_kernel_refuses_the_device_runs_on_it(call):
    # PyTorch's composite kernel of mode.values checks the device type by name (CPU, CUDA, XPU);
    # the registration file sends such out= forms to the CPU fallback instead
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 1.0]])
    cpu_out = (torch.empty(0), torch.empty(0, dtype=torch.long))
    device_out = tuple(t.to(DEVICE) for t in cpu_out)
    call(x, cpu_out)
    call(x.to(DEVICE), device_out)
    for d, c in zip(device_out, cpu_out):
        assert_same(d, c)
