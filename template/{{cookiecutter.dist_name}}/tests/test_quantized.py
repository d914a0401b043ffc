"""Quantized tensors on the device: the CPU fallback runs PyTorch's QuantizedCPU kernels on them
(csrc/aten/fallback.cpp), and copies move their integer bytes (csrc/aten/minimal_ops.cpp)."""

import pytest
import torch

from tests.conftest import DEVICE


@pytest.mark.parametrize("dtype, zero_point", [(torch.qint8, 10), (torch.quint8, 128), (torch.qint32, 0)])
def test_quantize_per_tensor_equals_the_cpu(dtype, zero_point):
    x = torch.randn(3, 4, 5)
    ref = torch.quantize_per_tensor(x, 0.1, zero_point, dtype)
    q = torch.quantize_per_tensor(x.to(DEVICE), 0.1, zero_point, dtype)
    assert q.device.type == DEVICE and q.is_quantized and q.dtype == dtype
    assert q.q_scale() == 0.1 and q.q_zero_point() == zero_point and q.qscheme() == torch.per_tensor_affine
    assert torch.equal(q.int_repr().cpu(), ref.int_repr())
    d = q.dequantize()
    assert d.device.type == DEVICE and d.dtype == torch.float32
    assert torch.equal(d.cpu(), ref.dequantize())


def test_quantize_per_channel_equals_the_cpu():
    x = torch.randn(3, 4)
    scales, zero_points = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0, 1, 2])
    ref = torch.quantize_per_channel(x, scales, zero_points, 0, torch.quint8)
    q = torch.quantize_per_channel(x.to(DEVICE), scales.to(DEVICE), zero_points.to(DEVICE), 0, torch.quint8)
    assert torch.equal(q.q_per_channel_scales().cpu(), ref.q_per_channel_scales())
    assert torch.equal(q.dequantize().cpu(), ref.dequantize())


def test_quantized_tensors_move_between_host_and_device():
    ref = torch.quantize_per_tensor(torch.randn(6), 0.05, 3, torch.qint8)
    on_device = ref.to(DEVICE)
    assert on_device.is_quantized and on_device.device.type == DEVICE and on_device.q_scale() == 0.05
    back = on_device.cpu()
    assert back.is_quantized and torch.equal(back.int_repr(), ref.int_repr()) and back.q_zero_point() == 3


def test_a_quantized_tensor_copied_to_the_host_is_a_host_tensor():
    ref = torch.quantize_per_tensor(torch.randn(6), 0.05, 3, torch.qint8)
    back = ref.to(DEVICE).cpu()
    assert back.device.type == "cpu" and back.int_repr().device.type == "cpu"
    assert torch.equal(back.int_repr(), ref.int_repr())


def test_a_non_contiguous_quantized_tensor_keeps_its_quantizer_when_copied():
    ref = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 2, torch.quint8)
    flat = ref.to(DEVICE).t().ravel()  # a copy (clone), not a view
    assert flat.is_quantized and flat.device.type == DEVICE
    assert flat.q_scale() == 0.1 and flat.q_zero_point() == 2
    assert torch.equal(flat.int_repr().cpu(), ref.t().ravel().int_repr())
    assert torch.empty_like(ref.to(DEVICE)).q_scale() == 0.1
