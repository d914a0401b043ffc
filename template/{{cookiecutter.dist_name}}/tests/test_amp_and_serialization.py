"""Autocast and torch.save/torch.load on the device."""

import io

import torch

from tests.conftest import DEVICE


def test_autocast_lowers_matmul_and_keeps_fp32_ops(mod):
    assert torch.bfloat16 in mod.get_amp_supported_dtype()
    a = torch.randn(8, 8, device=DEVICE)
    b = torch.randn(8, 8, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEVICE)
        mm = a @ b
        lin = torch.nn.functional.linear(a, b)
        soft = torch.softmax(mm, dim=-1)
        s = torch.sin(a)  # not listed: falls through, keeps its dtype
    assert mm.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert soft.dtype == torch.float32
    assert s.dtype == torch.float32
    torch.testing.assert_close(mm.float().cpu(), a.cpu() @ b.cpu(), atol=0.2, rtol=0.05)


def test_autocast_default_dtype():
    # torch.autocast(device) with no dtype: float16 for a PrivateUse1 device (each entry of the
    # project's autocast table, dot's float32 among them, is tested in test_amp_policies.py)
    assert torch.get_autocast_dtype(DEVICE) == torch.float16
    x, y = (torch.randn(4, device=DEVICE, dtype=torch.float32) for _ in range(2))
    with torch.autocast(DEVICE):
        assert torch.mm(x[None], y[:, None]).dtype == torch.float16


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_save_load_round_trip_to_the_device(mod):
    x = torch.randn(5, device=DEVICE)
    y = _round_trip(x)
    assert y.device == x.device and torch.equal(y.cpu(), x.cpu())


def test_map_location(mod):
    x = torch.randn(5, device=DEVICE)
    assert _round_trip(x, map_location="cpu").device.type == "cpu"
    if mod.device_count() > 1:
        y = _round_trip(x, map_location=f"{DEVICE}:1")
        assert y.device == torch.device(DEVICE, 1) and torch.equal(y.cpu(), x.cpu())


def test_state_dict_round_trip():
    model = torch.nn.Linear(3, 2).to(DEVICE)
    state = _round_trip(model.state_dict())
    fresh = torch.nn.Linear(3, 2).to(DEVICE)
    fresh.load_state_dict(state)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert q.device.type == DEVICE and torch.equal(p.cpu(), q.cpu())


def test_backend_meta_survives_save_and_load(mod):
    x = torch.randn(4, device=DEVICE)
    mod.set_layout_tag(x, True)
    assert mod.layout_tag(x)
    y = _round_trip(x)
    assert mod.layout_tag(y)
    z = _round_trip(torch.randn(4, device=DEVICE))
    assert not mod.layout_tag(z)
