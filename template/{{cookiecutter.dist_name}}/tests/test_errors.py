"""Argument errors are raised by the call that made them, as on CUDA: shapes, overlap and devices are
checked on the host before anything is queued (csrc/aten/minimal_ops.cpp's check_copy; the meta
pre-pass of queued kernels, which sees arguments that share memory as sharing it:
kernels::meta_like). Only errors that depend on the data may surface at the next synchronize. An
error that surfaced later would fail whatever code ran next instead.
"""

import pytest
import torch

from tests.conftest import DEVICE

SHAPES = "must match the size|doesn't match the broadcast shape"
OVERLAP = "refer to a single memory location|refers to a single memory location"


def assert_device_still_fine():
    # nothing left in the queue to fail the next, unrelated call
    getattr(torch, DEVICE).synchronize()
    assert (torch.ones(2, device=DEVICE) + 1).cpu().tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(lambda: torch.zeros(4, device=DEVICE), id="device"),
        pytest.param(lambda: torch.zeros(4), id="host"),
        pytest.param(lambda: torch.zeros(2, 3, device=DEVICE), id="broadcast-beyond-the-output"),
    ],
)
def test_a_copy_whose_shapes_do_not_broadcast_raises_in_the_call(src):
    dst = torch.zeros(3, device=DEVICE)
    with pytest.raises(RuntimeError, match=SHAPES):
        dst.copy_(src())
    assert_device_still_fine()


def test_a_copy_into_a_partly_overlapping_output_raises_in_the_call():
    x = torch.arange(6.0, device=DEVICE)
    with pytest.raises(RuntimeError, match=OVERLAP):
        x[1:].copy_(x[:-1])
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert_device_still_fine()


def test_a_copy_into_an_output_with_internal_overlap_raises_in_the_call():
    with pytest.raises(RuntimeError, match=OVERLAP):
        torch.zeros(1, device=DEVICE).expand(3).copy_(torch.ones(3, device=DEVICE))
    assert_device_still_fine()


@pytest.mark.parametrize("op", [torch.add, torch.mul], ids=["add", "mul"])
def test_an_out_that_overlaps_its_input_raises_in_the_call(op):
    x = torch.arange(6.0, device=DEVICE)
    with pytest.raises(RuntimeError, match=OVERLAP):
        op(x[:-1], 2, out=x[1:])
    with pytest.raises(RuntimeError, match=OVERLAP):
        op(x[:3], 2, out=x[:1].expand(3))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert_device_still_fine()


def test_an_in_place_op_on_an_input_it_fully_aliases_still_works():
    x = torch.arange(4.0, device=DEVICE)
    x.add_(x)  # the same memory, not a partial overlap: allowed, as on the CPU
    x.copy_(x)
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_indexing_a_cpu_tensor_with_device_indices_raises():
    x = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same device"):
        x[torch.tensor([0, 2], device=DEVICE)]
    # the other way round is allowed, as on CUDA
    assert x.to(DEVICE)[torch.tensor([0, 2])].cpu().tolist() == [0.0, 2.0]


# the CPU fallback's message (PyTorch's), or a native kernel's (kernels::common_device), once add-op made one
MIXED = "Expected all tensors to be on the same device|expected all tensors on the same"


@pytest.mark.parametrize("op", [torch.atan2, torch.hypot], ids=["atan2", "hypot"])
def test_a_pointwise_operator_refuses_a_cpu_tensor_beside_device_ones(op):
    a, b = torch.rand(3), torch.rand(3, device=DEVICE)
    with pytest.raises(RuntimeError, match=MIXED):
        op(a, b)
    with pytest.raises(RuntimeError, match=MIXED):
        op(b, a)
    # a CPU scalar (0-dim) is fine beside device tensors, as on CUDA
    torch.testing.assert_close(op(b, torch.tensor(0.5)).cpu(), op(b.cpu(), torch.tensor(0.5)))


@pytest.mark.parametrize(
    "call",
    [
        lambda d, c: torch.cat([c, d]),
        lambda d, c: torch.cat([d, c]),
        lambda d, c: torch.stack([d, c]),
        lambda d, c: torch.bucketize(d, c),
        lambda d, c: torch.searchsorted(d, torch.tensor(1.0)),  # a CPU scalar too
    ],
    ids=["cat-cpu-first", "cat-device-first", "stack", "bucketize", "searchsorted-cpu-scalar"],
)
def test_an_operator_without_its_own_device_check_refuses_a_cpu_tensor(call):
    """ATen operators that do not check devices themselves (no `device_check: NoCheck` in
    native_functions.yaml: cat, bucketize, ...) take every tensor on one device, a CPU scalar
    neither, as on CUDA; the CPU fallback reads which they are from the installed torch."""
    d, c = torch.arange(2.0, device=DEVICE), torch.arange(2.0)
    with pytest.raises(RuntimeError, match=MIXED):
        call(d, c)
    assert torch.cat([d, d]).cpu().tolist() == [0.0, 1.0, 0.0, 1.0]
    assert_device_still_fine()


@pytest.mark.skipif({{ cookiecutter.num_devices }} < 2, reason="needs two devices")
def test_an_operator_without_its_own_device_check_refuses_two_devices():
    with pytest.raises(RuntimeError, match=MIXED):
        torch.cat([torch.ones(2, device=f"{DEVICE}:0"), torch.ones(2, device=f"{DEVICE}:1")])
