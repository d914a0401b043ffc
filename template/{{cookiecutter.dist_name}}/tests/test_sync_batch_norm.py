"""SyncBatchNorm's operators (csrc/aten/sync_batch_norm.cpp), in this process: nn.SyncBatchNorm's
algorithm run by hand over ranks simulated as slices of one batch — per-slice statistics, gathered,
normalize; per-slice gradient sums, summed, input gradient — must give what batch norm on the whole
batch gives on the CPU (forward, running statistics, gradients of input, weight and bias). The
multi-process run is tests/distributed (the "syncbn" scenario)."""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import DEVICE

EPS, MOMENTUM = 1e-5, 0.1


def _sync_bn(x: torch.Tensor, weight, bias, running_mean, running_var, grad_out, slices: int):
    """SyncBatchNorm's forward and backward on `slices` simulated ranks (torch/nn/modules/_functions.py)."""
    parts, grads = x.chunk(slices), grad_out.chunk(slices)
    stats = [torch.batch_norm_stats(p, EPS) for p in parts]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor([p.numel() // p.size(1) for p in parts], dtype=mean_all.dtype, device=x.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean_all, invstd_all, running_mean, running_var, MOMENTUM, EPS, counts)
    out = torch.cat([torch.batch_norm_elemt(p, weight, bias, mean, invstd, EPS) for p in parts])
    reduced = [torch.batch_norm_backward_reduce(g, p, mean, invstd, weight, True, True, True) for g, p in zip(grads, parts)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    grad_weight = sum(r[2] for r in reduced)
    grad_bias = sum(r[3] for r in reduced)
    grad_in = torch.cat([
        torch.batch_norm_backward_elemt(g, p, mean, invstd, weight, sum_dy, sum_dy_xmu, counts.to(torch.int32))
        for g, p in zip(grads, parts)])
    return out, grad_in, grad_weight, grad_bias


@pytest.mark.parametrize("shape,slices", [((8, 3, 5, 4), 2), ((12, 4, 6), 4), ((6, 3), 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sync_batch_norm_ops_equal_batch_norm_on_the_whole_batch(shape, slices, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=dtype) * 3 + 1
    weight = torch.rand(shape[1], generator=g, dtype=dtype) + 0.5
    bias = torch.randn(shape[1], generator=g, dtype=dtype)
    grad_out = torch.randn(shape, generator=g, dtype=dtype)

    xc, wc, bc = (t.clone().requires_grad_() for t in (x, weight, bias))
    rm_ref, rv_ref = torch.zeros(shape[1], dtype=dtype), torch.ones(shape[1], dtype=dtype)
    ref = F.batch_norm(xc, rm_ref, rv_ref, wc, bc, training=True, momentum=MOMENTUM, eps=EPS)
    ref.backward(grad_out)

    rm, rv = torch.zeros(shape[1], dtype=dtype, device=DEVICE), torch.ones(shape[1], dtype=dtype, device=DEVICE)
    out, grad_in, grad_weight, grad_bias = _sync_bn(
        x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), rm, rv, grad_out.to(DEVICE), slices)
    assert out.device.type == DEVICE and grad_in.device.type == DEVICE
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.cpu(), ref.detach(), **tol)
    torch.testing.assert_close(rm.cpu(), rm_ref, **tol)
    torch.testing.assert_close(rv.cpu(), rv_ref, **tol)  # unbiased variance, as batch norm keeps it
    torch.testing.assert_close(grad_in.cpu(), xc.grad, **tol)
    torch.testing.assert_close(grad_weight.cpu(), wc.grad, **tol)
    torch.testing.assert_close(grad_bias.cpu(), bc.grad, **tol)


def test_half_inputs_get_float_statistics_as_on_cuda():
    x = torch.randn(4, 3, 5).to(torch.bfloat16)
    mean, invstd = torch.batch_norm_stats(x.to(DEVICE), EPS)
    assert mean.dtype == invstd.dtype == torch.float32
    torch.testing.assert_close(mean.cpu(), x.float().mean((0, 2)))
    torch.testing.assert_close(invstd.cpu(), (x.float().var((0, 2), unbiased=False) + EPS).rsqrt())
    out = torch.batch_norm_elemt(x.to(DEVICE), None, None, mean, invstd, EPS)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), F.batch_norm(x.float(), None, None, training=True, eps=EPS).to(torch.bfloat16))


def test_gather_stats_with_one_count_for_every_rank():
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    parts = x.to(DEVICE).chunk(2)
    stats = [torch.batch_norm_stats(p, EPS) for p in parts]
    mean, invstd = torch.batch_norm_gather_stats(
        x.to(DEVICE), torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]), None, None, MOMENTUM, EPS, 9)
    torch.testing.assert_close(mean.cpu(), x.mean((0, 2)))
    torch.testing.assert_close(invstd.cpu(), (x.var((0, 2), unbiased=False) + EPS).rsqrt())
