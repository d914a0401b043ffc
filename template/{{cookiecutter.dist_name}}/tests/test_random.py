"""Per-device generators: seeding, state, torch.Generator(device=...)."""

import torch

from tests.conftest import DEVICE


def test_manual_seed_is_reproducible(mod):
    mod.manual_seed(1234)
    a = torch.randn(8, device=DEVICE)
    mod.manual_seed(1234)
    b = torch.randn(8, device=DEVICE)
    assert torch.equal(a.cpu(), b.cpu())
    assert mod.initial_seed() == 1234


def test_torch_manual_seed_seeds_the_device(mod):
    torch.manual_seed(7)
    a = torch.rand(8, device=DEVICE)
    torch.manual_seed(7)
    b = torch.rand(8, device=DEVICE)
    assert torch.equal(a.cpu(), b.cpu())


def test_rng_state_round_trip(mod):
    state = mod.get_rng_state()
    a = torch.randn(8, device=DEVICE)
    mod.set_rng_state(state)
    b = torch.randn(8, device=DEVICE)
    assert torch.equal(a.cpu(), b.cpu())


def test_generator_on_device():
    g = torch.Generator(device=DEVICE)
    assert g.device.type == DEVICE
    g.manual_seed(0)
    a = torch.randn(8, device=DEVICE, generator=g)
    g.manual_seed(0)
    b = torch.randn(8, device=DEVICE, generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    c = torch.randn(8, device=DEVICE, generator=g)
    assert not torch.equal(b.cpu(), c.cpu())


def test_dropout_and_randint_run_on_device():
    x = torch.ones(1000, device=DEVICE)
    y = torch.nn.functional.dropout(x, 0.5)
    assert 300 < int((y == 0).sum().item()) < 700
    r = torch.randint(0, 10, (100,), device=DEVICE)
    assert r.min().item() >= 0 and r.max().item() < 10
