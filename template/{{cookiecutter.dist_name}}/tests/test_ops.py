"""The minimal operator set, the CPU fallback and the native add/mul kernels."""


import pytest
import torch

from tests.conftest import DEVICE, fallback_warnings


def test_copies_views_and_scalars():
    x = torch.arange(12.0).reshape(3, 4)
    d = x.to(DEVICE)
    assert torch.equal(d.cpu(), x)
    assert torch.equal(d.view(4, 3).cpu(), x.view(4, 3))
    assert torch.equal(d.t().contiguous().cpu(), x.t().contiguous())
    assert torch.equal(d.as_strided((2, 2), (4, 1), 1).cpu(), x.as_strided((2, 2), (4, 1), 1))
    assert torch.equal(d[1:, ::2].cpu(), x[1:, ::2])
    assert d[2, 3].item() == 11.0
    assert torch.equal(d.to(torch.int32).cpu(), x.to(torch.int32))  # dtype conversion on the way


def test_device_to_device_copy_between_indices(mod):
    if mod.device_count() < 2:
        pytest.skip("needs two devices")
    a = torch.arange(5.0, device=f"{DEVICE}:0")
    b = a.to(f"{DEVICE}:1")
    assert b.device.index == 1 and torch.equal(b.cpu(), a.cpu())


def test_resize_and_set():
    d = torch.empty(0, device=DEVICE)
    d.resize_(5)
    d.fill_(3.0)
    assert d.cpu().tolist() == [3.0] * 5
    e = torch.empty(0, device=DEVICE)
    e.set_(d)
    assert e.data_ptr() == d.data_ptr() and e.shape == (5,)
    f = torch.empty(0, device=DEVICE).set_(d.untyped_storage(), 1, (2,), (1,))
    assert f.cpu().tolist() == [3.0, 3.0]


def test_native_add_and_mul_do_not_fall_back(mod):
    a, b = torch.randn(16), torch.randn(16)
    da, db = a.to(DEVICE), b.to(DEVICE)
    mod.reset_fallback_counts()
    out = torch.empty(0, device=DEVICE)
    results = [da + db, da * db, da.clone().add_(db), torch.mul(da, db, out=out), da.add(db, alpha=2)]
    counts = mod.fallback_counts()
    assert not [k for k in counts if k.startswith(("aten::add", "aten::mul"))], counts
    expected = [a + b, a * b, a + b, a * b, a.add(b, alpha=2)]
    for got, want in zip(results, expected):
        assert got.device.type == DEVICE
        torch.testing.assert_close(got.cpu(), want)
    assert out.shape == (16,)  # the empty out= tensor grew


def test_native_add_allocates_its_result_in_device_memory(mod):
    a = torch.randn(1000, device=DEVICE)
    before = torch.accelerator.memory_allocated()
    c = a + a
    assert torch.accelerator.memory_allocated() - before >= c.numel() * c.element_size()
    del c
    assert torch.accelerator.memory_allocated() == before


def test_native_add_follows_cpu_type_promotion_broadcasting_and_layout():
    i = torch.arange(6).reshape(2, 3)
    f = torch.randn(3)
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    cases = [(i, f), (i, torch.tensor(2.5)), (torch.tensor(2.5), i), (i, True), (cl, cl), (torch.empty(0, 3), f)]
    for x, y in cases:
        dx = x.to(DEVICE) if isinstance(x, torch.Tensor) and x.dim() else x
        dy = y.to(DEVICE) if isinstance(y, torch.Tensor) and y.dim() else y  # 0-dim CPU tensors stay on the CPU
        got, want = dx + dy, x + y
        assert got.device.type == DEVICE and got.dtype == want.dtype and got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want)


def test_native_kernels_reject_a_cpu_tensor_argument():
    d = torch.ones(3, device=DEVICE)
    for call in (lambda: d + torch.ones(3), lambda: torch.ones(3) * d, lambda: torch.add(d, torch.ones(3), out=d)):
        with pytest.raises(RuntimeError, match="same .*device"):
            call()


def test_recycled_host_views_do_not_leak_state_between_calls():
    # every kernel views device memory through CPU tensors that are re-pointed between calls:
    # dtype, shape, strides, offset and the conjugate bit of one call must not reach the next
    x = torch.randn(4, 6, dtype=torch.float64)
    z = torch.randn(5, dtype=torch.complex64)
    d, dz = x.to(DEVICE), z.to(DEVICE)
    view = d[1:, ::2]  # keeps a storage alive across the calls below
    for _ in range(3):
        torch.testing.assert_close((d.t() * 2).cpu(), x.t() * 2)
        torch.testing.assert_close((dz.conj() + dz).cpu(), z.conj() + z)
        torch.testing.assert_close((dz.conj().imag * 2).cpu(), z.conj().imag * 2)  # a negative view
        torch.testing.assert_close((view + 1).cpu(), x[1:, ::2] + 1)
        torch.testing.assert_close((d[2:].to(torch.int32) + 1).cpu(), x[2:].to(torch.int32) + 1)
        out = torch.empty(0, device=DEVICE, dtype=torch.float64)
        torch.add(d, d, out=out)  # the out= view is grown by the CPU kernel, then copied back
        torch.testing.assert_close(out.cpu(), x + x)
    torch.testing.assert_close(view.cpu(), x[1:, ::2])


def test_fallback_runs_counts_and_warns(mod):
    x = torch.randn(10)
    d = x.to(DEVICE)
    mod.reset_fallback_counts()
    torch.testing.assert_close(torch.sin(d).cpu(), torch.sin(x))
    assert mod.fallback_counts().get("aten::sin", 0) >= 1  # sin.Tensor is structured: it falls back whole
    assert any("aten::cos" in m for m in fallback_warnings(mod, lambda: torch.cos(d)))


def test_fallback_with_mixed_dtypes_and_in_place():
    x = torch.randn(4, 4)
    d = x.to(DEVICE)
    d.exp_()
    torch.testing.assert_close(d.cpu(), x.exp())
    i = torch.tensor([0, 2]).to(DEVICE)
    torch.testing.assert_close(d.index_select(0, i).cpu(), x.exp().index_select(0, torch.tensor([0, 2])))
