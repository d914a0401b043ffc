"""torch.mm, bmm, addmm and baddbmm with `out_dtype=` on the device (csrc/aten/out_dtype_matmul.cpp;
CUDA-only in PyTorch): a float result of bfloat16 and half inputs, equal to the float product of
the same inputs on the CPU, and CUDA's refusal of other dtypes."""

import pytest
import torch

from tests.conftest import DEVICE


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 4, generator=g).to(dtype), torch.randn(2, 4, 5, generator=g).to(dtype)
    bias = torch.randn(3, 5, generator=g)
    return a, b, bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_float_result_of_narrow_inputs_equals_the_float_product(dtype):
    a, b, bias = _inputs(dtype)
    da, db, dbias = a.to(DEVICE), b.to(DEVICE), bias.to(DEVICE)
    fa, fb = a.float(), b.float()
    cases = {
        "mm": (torch.mm(da[0], db[0], out_dtype=torch.float32), fa[0] @ fb[0]),
        "bmm": (torch.bmm(da, db, out_dtype=torch.float32), torch.bmm(fa, fb)),
        "addmm": (torch.addmm(dbias, da[0], db[0], out_dtype=torch.float32, beta=0.5, alpha=2),
                  torch.addmm(bias, fa[0], fb[0], beta=0.5, alpha=2)),
        "baddbmm": (torch.baddbmm(dbias, da, db, out_dtype=torch.float32, beta=0.5, alpha=2),
                    torch.baddbmm(bias, fa, fb, beta=0.5, alpha=2)),
    }
    for name, (got, expected) in cases.items():
        assert got.device.type == DEVICE and got.dtype == torch.float32, name
        torch.testing.assert_close(got.cpu(), expected, msg=name)
    out = torch.empty(0, device=DEVICE)
    torch.mm(da[0], db[0], out_dtype=torch.float32, out=out)
    torch.testing.assert_close(out.cpu(), fa[0] @ fb[0])


def test_the_same_dtype_is_accepted_and_others_are_refused_as_on_cuda():
    a, b, _ = _inputs(torch.float32)
    got = torch.mm(a[0].to(DEVICE), b[0].to(DEVICE), out_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), a[0] @ b[0])
    with pytest.raises(RuntimeError, match="out_dtype must be the same as the input dtype"):
        torch.mm(a[0].to(DEVICE), b[0].to(DEVICE), out_dtype=torch.float16)
