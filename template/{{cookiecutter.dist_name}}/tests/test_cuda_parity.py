"""Operators the CPU kernel accepts less of than CUDA's (csrc/aten/cuda_parity.cpp): code written
for accelerators takes CUDA's behaviour for granted on every device but the CPU."""

import pytest
import torch

from tests.conftest import DEVICE


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_counts_integers_as_cuda_does(dtype):
    # Hugging Face's mixture-of-experts routing: torch.histc(expert_ids.int(), bins=E, min=0, max=E-1)
    ids = torch.randint(0, 8, (64,)).to(dtype)
    counts = torch.histc(ids.to(DEVICE), bins=8, min=0, max=7)
    assert counts.dtype == dtype and counts.device.type == DEVICE
    assert counts.cpu().tolist() == torch.bincount(ids.long(), minlength=8).tolist()
    out = torch.empty(0, dtype=dtype, device=DEVICE)
    torch.histc(ids.to(DEVICE), bins=8, min=0, max=7, out=out)
    assert torch.equal(out.cpu(), counts.cpu())


def test_histc_of_floats_equals_the_cpu():
    x = torch.randn(1000)
    for kw in ({"bins": 10}, {"bins": 7, "min": -1, "max": 1}):
        assert torch.equal(torch.histc(x.to(DEVICE), **kw).cpu(), torch.histc(x, **kw))
