"""Per-device generators: seeding, state, torch.Generator(device=...)."""

import threading

import pytest
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


def _draw(gen, n, op):
    if op == "normal":  # the device's own random kernel (csrc/aten/random_ops.cpp)
        return torch.randn(n, device=DEVICE, generator=gen)
    return torch.poisson(torch.full((n,), 4.0, device=DEVICE), generator=gen)  # through the CPU fallback


@pytest.mark.parametrize("op", ["normal", "poisson"])
def test_two_threads_drawing_from_one_generator_never_get_the_same_numbers(mod, op):
    # Each thread draws on a stream of its own, so nothing but the generator's lock orders the
    # draws: the lock must cover copying the state, drawing and writing it back.
    n, k = (1 << 20 if op == "normal" else 1 << 18), 8  # each draw takes milliseconds
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(1234)
    sequential = sorted(_draw(gen, n, op).cpu().numpy().tobytes() for _ in range(2 * k))
    gen.manual_seed(1234)
    drawn = [[], []]
    together = threading.Barrier(2)

    def worker(i):
        s = mod.Stream()
        with mod.stream(s):
            for _ in range(k):
                together.wait()  # both threads start each draw at the same moment
                drawn[i].append(_draw(gen, n, op))
        s.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = sorted(t.cpu().numpy().tobytes() for t in drawn[0] + drawn[1])
    assert len(set(got)) == 2 * k  # no two draws alike
    assert got == sequential  # and together they are the draws of one thread, in some order
