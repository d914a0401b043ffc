"""The template's own C++ kernels are launches, as generated ones are: they decide their outputs on
the host, queue their computation on the current stream and return without waiting for it.

Each case holds the stream (`_held_stream`: nothing queued on it runs until the block ends), calls a
kernel written by hand in csrc/aten/ (the fused LSTM and GRU cells and their backward, scaled
dot-product attention and its backward, a matmul with out_dtype=, histc, arange, the SyncBatchNorm
statistics operators, batch norm) or a generated out= kernel given an empty out (add-op's default
kernels), and records an event: a kernel that waited for the stream to
drain would return only once the hold timed out, the event would be complete, and the hold fails
the block. Then the results are compared with the CPU. On a driver without queued host work (the
minimal driver) every kernel runs before the call returns, and these tests skip.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import DEVICE, queued_kernels

pytestmark = [queued_kernels, pytest.mark.usefixtures("drained")]


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---- each case: inputs (CPU), the kernels on the device, the same values computed on the CPU -----


def _lstm_reference(ig, hg, cx, ib, hb, grad_hy, grad_cy):
    gates = (ig + hg + ib + hb).requires_grad_()
    c = cx.clone().requires_grad_()
    i, f, g, o = gates.chunk(4, 1)
    cy = f.sigmoid() * c + i.sigmoid() * g.tanh()
    hy = o.sigmoid() * cy.tanh()
    torch.autograd.backward([hy, cy], [grad_hy, grad_cy])
    return [hy.detach(), cy.detach(), gates.grad, c.grad, gates.grad.sum(0)]


def _lstm_device(ig, hg, cx, ib, hb, grad_hy, grad_cy):
    hy, cy, workspace = torch.ops.aten._thnn_fused_lstm_cell(ig, hg, cx, ib, hb)
    grad_gates, grad_cx, grad_bias = torch.ops.aten._thnn_fused_lstm_cell_backward_impl(
        grad_hy, grad_cy, cx, cy, workspace, True
    )
    return [hy, cy, grad_gates, grad_cx, grad_bias]


def _lstm_inputs():
    b, h = 8, 16
    return [
        _randn(b, 4 * h, seed=1),
        _randn(b, 4 * h, seed=2),
        _randn(b, h, seed=3),
        _randn(4 * h, seed=4),
        _randn(4 * h, seed=5),
        _randn(b, h, seed=6),
        _randn(b, h, seed=7),
    ]


def _gru_reference(ig, hg, hx, ib, hb, grad_hy):
    ig, hg, h = ig.clone().requires_grad_(), hg.clone().requires_grad_(), hx.clone().requires_grad_()
    ir, iz, in_ = (ig + ib).chunk(3, 1)
    hr, hz, hn = (hg + hb).chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (h - n)
    hy.backward(grad_hy)
    return [hy.detach(), ig.grad, hg.grad, h.grad, ig.grad.sum(0), hg.grad.sum(0)]


def _gru_device(ig, hg, hx, ib, hb, grad_hy):
    hy, workspace = torch.ops.aten._thnn_fused_gru_cell(ig, hg, hx, ib, hb)
    grads = torch.ops.aten._thnn_fused_gru_cell_backward(grad_hy, workspace, True)
    return [hy, *grads]


def _gru_inputs():
    b, h = 8, 16
    return [
        _randn(b, 3 * h, seed=1),
        _randn(b, 3 * h, seed=2),
        _randn(b, h, seed=3),
        _randn(3 * h, seed=4),
        _randn(3 * h, seed=5),
        _randn(b, h, seed=6),
    ]


def _sdpa_reference(q, k, v, grad_out):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(grad_out)
    return [out.detach(), q.grad, k.grad, v.grad]


def _sdpa_device(q, k, v, grad_out):
    assert torch._fused_sdp_choice(q, k, v, is_causal=True) == 4  # SDPBackend.overrideable: the kernels here
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(grad_out)
    return [out.detach(), q.grad, k.grad, v.grad]


def _sdpa_inputs():
    return [_randn(2, 3, 8, 16, seed=s) for s in range(4)]


def _out_dtype_inputs():
    return [
        _randn(2, 8, 12, dtype=torch.bfloat16, seed=1),
        _randn(2, 12, 4, dtype=torch.bfloat16, seed=2),
        _randn(8, 4, seed=3),
    ]


def _out_dtype_device(a, b, bias):
    out = torch.empty(8, 4, device=a.device)
    torch.mm(a[0], b[0], out_dtype=torch.float32, out=out)
    return [
        torch.mm(a[0], b[0], out_dtype=torch.float32),
        torch.bmm(a, b, out_dtype=torch.float32),
        torch.addmm(bias, a[1], b[1], out_dtype=torch.float32, beta=0.5, alpha=2),
        torch.baddbmm(bias, a, b, out_dtype=torch.float32),
        out,
    ]


def _out_dtype_reference(a, b, bias):
    a, b = a.float(), b.float()
    return [
        a[0] @ b[0],
        a @ b,
        torch.addmm(bias, a[1], b[1], beta=0.5, alpha=2),
        torch.baddbmm(bias, a, b),
        a[0] @ b[0],
    ]


def _histc_inputs():
    return [_randn(1000, seed=1), torch.randint(0, 8, (1000,), generator=torch.Generator().manual_seed(2))]


def _histc_device(x, ids):
    out = torch.empty(0, device=x.device)
    torch.histc(x, bins=10, min=-2, max=2, out=out)
    return [torch.histc(x, bins=10, min=-2, max=2), torch.histc(ids, bins=8, min=0, max=7), out]


def _histc_reference(x, ids):
    counts = torch.histc(x, bins=10, min=-2, max=2)
    return [counts, torch.histc(ids.double(), bins=8, min=0, max=7).long(), counts]


def _arange_inputs():
    return []


def _arange_device():
    # every overload ends in arange.start_out on an empty tensor it must size; an out= of the right
    # element count keeps its shape, as on the CPU
    out, shaped = torch.empty(0, device=DEVICE), torch.empty(2, 5, device=DEVICE)
    torch.arange(1, 10, 0.5, out=out)
    torch.arange(10, out=shaped)
    return [
        torch.arange(64, device=DEVICE),
        torch.arange(0, 64, 3, device=DEVICE, dtype=torch.float32),
        torch.arange(5.0, -3.0, -0.75, device=DEVICE, dtype=torch.float64),
        torch.arange(8, device=DEVICE, dtype=torch.bfloat16),
        out,
        shaped,
    ]


def _arange_reference():
    shaped = torch.empty(2, 5)
    torch.arange(10, out=shaped)
    return [
        torch.arange(64),
        torch.arange(0, 64, 3, dtype=torch.float32),
        torch.arange(5.0, -3.0, -0.75, dtype=torch.float64),
        torch.arange(8, dtype=torch.bfloat16),
        torch.arange(1, 10, 0.5),
        shaped,
    ]


def _empty_out_inputs():
    return [_randn(6, 5, seed=1), _randn(6, 5, seed=2), _randn(5, 3, seed=3), _randn(2, 3, 4, 4, seed=4)]


def _empty_out_device(a, b, m, x):
    # generated kernels of structured operators (the project's default add-op kernels) with an empty
    # out: the host gives it the size (and, for a channels-last input, the strides) the CPU kernel
    # would, and queues the call
    outs = [torch.empty(0, device=a.device) for _ in range(6)]
    x = x.to(memory_format=torch.channels_last)
    torch.add(a, b, alpha=2, out=outs[0])
    torch.mm(a, m, out=outs[1])
    torch.sum(a, 1, out=outs[2])
    torch.lerp(a, b, 0.25, out=outs[3])
    torch.addcmul(a, a, b, value=0.5, out=outs[4])
    torch.add(x, x, out=outs[5])
    return outs


def _empty_out_reference(a, b, m, x):
    return [torch.add(a, b, alpha=2), a @ m, a.sum(1), torch.lerp(a, b, 0.25), torch.addcmul(a, a, b, value=0.5), x + x]


EPS = 1e-5


def _sync_bn_inputs():
    return [
        _randn(6, 4, 5, seed=1),
        _randn(4, seed=2),
        _randn(4, seed=3),
        _randn(6, 4, 5, seed=4),
        torch.zeros(4),
        torch.ones(4),
    ]


def _sync_bn_device(x, weight, bias, grad, running_mean, running_var):
    # one rank's SyncBatchNorm forward and backward, the collectives left out (a world of one)
    mean, invstd = torch.batch_norm_stats(x, EPS)
    counts = torch.full((1,), x.numel() / x.size(1), device=x.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean[None], invstd[None], running_mean, running_var, 0.1, EPS, counts
    )
    out = torch.batch_norm_elemt(x, weight, bias, mean, invstd, EPS)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
        grad, x, mean, invstd, weight, True, True, True
    )
    grad_x = torch.batch_norm_backward_elemt(grad, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts.to(torch.int32))
    return [out, grad_x, grad_weight, grad_bias, running_mean, running_var]


def _bn_reference(x, weight, bias, grad, running_mean, running_var):
    x, weight, bias = (t.clone().requires_grad_() for t in (x, weight, bias))
    out = F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.1, eps=EPS)
    out.backward(grad)
    return [out.detach(), x.grad, weight.grad, bias.grad, running_mean, running_var]


def _bn_device(x, weight, bias, grad, running_mean, running_var):
    out, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
        x, weight, bias, running_mean, running_var, True, 0.1, EPS
    )
    return [out, save_mean, save_invstd, running_mean, running_var]


def _native_bn_reference(x, *rest):
    ref = _bn_reference(x, *rest)
    dims = (0, 2)
    invstd = (x.var(dims, unbiased=False) + EPS).rsqrt()
    return [ref[0], x.mean(dims), invstd, ref[4], ref[5]]


CASES = {
    "lstm_cell": (_lstm_inputs, _lstm_device, _lstm_reference),
    "gru_cell": (_gru_inputs, _gru_device, _gru_reference),
    "scaled_dot_product_attention": (_sdpa_inputs, _sdpa_device, _sdpa_reference),
    "out_dtype_matmul": (_out_dtype_inputs, _out_dtype_device, _out_dtype_reference),
    "histc": (_histc_inputs, _histc_device, _histc_reference),
    "arange": (_arange_inputs, _arange_device, _arange_reference),
    "generated_kernels_empty_out": (_empty_out_inputs, _empty_out_device, _empty_out_reference),
    "sync_batch_norm": (_sync_bn_inputs, _sync_bn_device, _bn_reference),
    "native_batch_norm": (_sync_bn_inputs, _bn_device, _native_bn_reference),
}


@pytest.mark.parametrize("case", CASES)
def test_a_template_kernel_returns_before_the_stream_reaches_it(mod, case):
    make_inputs, on_device, reference = CASES[case]
    inputs = make_inputs()
    # a first call may load Python code (PyTorch's meta functions of some operators): not timed
    on_device(*[t.to(DEVICE) for t in inputs])
    device_inputs = [t.to(DEVICE) for t in inputs]
    mod.synchronize()
    with mod._held_stream():  # a kernel that waits for the stream returns only after the hold's timeout
        results = on_device(*device_inputs)
        done = torch.Event(device=DEVICE)
        done.record()
        waited = done.query()
    mod.synchronize()
    assert not waited, f"{case}: a kernel waited for the stream to drain before returning"
    expected = reference(*inputs)
    assert len(results) == len(expected)
    for i, (got, want) in enumerate(zip(results, expected)):
        assert got.device.type == DEVICE, (case, i)
        assert got.shape == want.shape and got.dtype == want.dtype, (case, i, got.shape, got.dtype)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4, msg=f"{case}: result {i}")


def test_an_empty_out_takes_the_strides_the_cpu_kernel_gives_it():
    x = _randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    on_cpu, on_device = torch.empty(0), torch.empty(0, device=DEVICE)
    torch.add(x, x, out=on_cpu)
    torch.add(x.to(DEVICE), x.to(DEVICE), out=on_device)
    assert on_device.shape == on_cpu.shape and on_device.stride() == on_cpu.stride()
    torch.testing.assert_close(on_device.cpu(), on_cpu)


@pytest.mark.parametrize(
    "args, kwargs",
    [((0, 10, 0), {}), ((0, 10, -1), {}), ((10, 0, 1), {}), ((0, float("inf")), {}), ((4,), {"dtype": torch.bool})],
    ids=["zero step", "step against the bounds", "bounds against the step", "infinite bound", "bool"],
)
def test_arange_refuses_what_the_cpu_refuses_in_the_call(mod, args, kwargs):
    # the host decides arange's size, so an argument the CPU refuses is refused by the call itself,
    # with the CPU's exception and message, never later from the queue
    with pytest.raises(Exception) as cpu:
        torch.arange(*args, **kwargs)
    with pytest.raises(type(cpu.value)) as dev:
        torch.arange(*args, device=DEVICE, **kwargs)
    mod.synchronize()  # nothing was queued that fails
    assert str(dev.value) == str(cpu.value)
