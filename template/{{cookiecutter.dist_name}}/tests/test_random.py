"""Per-device generators: seeding, state, torch.Generator(device=...), and random kernels queued
on a stream whose draws the host's call order fixes (csrc/runtime/generator.h)."""

import struct
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tests.conftest import DEVICE, queued_kernels, requires, run_python

BUSY_US = 300_000  # a stream's sleep long enough that the host finishes its calls meanwhile (other streams run)


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


def test_rng_state_is_seed_and_offset(mod):
    # The documented layout: 16 bytes, the seed then the offset (little-endian uint64 each); each
    # random kernel takes one offset.
    mod.manual_seed(1234)
    state = mod.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert struct.unpack("<QQ", bytes(state.tolist())) == (1234, 0)
    torch.randn(8, device=DEVICE)
    torch.rand(8, device=DEVICE)
    assert struct.unpack("<QQ", bytes(mod.get_rng_state().tolist())) == (1234, 2)
    with pytest.raises(RuntimeError, match="16"):
        mod.set_rng_state(torch.zeros(5, dtype=torch.uint8))


RANDOM_OPS = {
    "randn": lambda x: torch.randn(64, device=DEVICE),
    "rand": lambda x: torch.rand(64, device=DEVICE),
    "randint": lambda x: torch.randint(0, 10, (64,), device=DEVICE),
    "randperm": lambda x: torch.randperm(64, device=DEVICE),
    "bernoulli_p": lambda x: torch.empty(64, device=DEVICE).bernoulli_(0.5),
    "bernoulli_tensor": lambda x: torch.bernoulli(x / 2),
    "exponential": lambda x: torch.empty(64, device=DEVICE).exponential_(),
    "normal_tensor": lambda x: torch.normal(x, 1.0),
    "multinomial": lambda x: torch.multinomial(x, 8, replacement=True),
    "poisson": lambda x: torch.poisson(x),
    "dropout": lambda x: F.dropout(x, 0.5),
}


@queued_kernels
@pytest.mark.usefixtures("drained")
@pytest.mark.parametrize("op", list(RANDOM_OPS))
def test_a_random_kernel_is_queued_and_does_not_drain_the_stream(mod, op):
    x = torch.rand(64, device=DEVICE) + 0.5
    mod.synchronize()
    with mod._held_stream():
        r = RANDOM_OPS[op](x)
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query()  # the draw waits behind the hold; the host did not
    done.synchronize()
    assert r.device.type == DEVICE


def _draws(n):
    return [torch.randn(100, device=DEVICE) for _ in range(n)]


@requires("spin")
@pytest.mark.usefixtures("drained")
def test_the_host_call_order_fixes_the_draws_with_work_pending(mod):
    mod.manual_seed(5)
    expected = [t.cpu() for t in _draws(3)]
    mod.manual_seed(5)
    slow, fast = mod.Stream(), mod.Stream()
    with mod.stream(slow):
        mod._sleep(BUSY_US)
        first = torch.randn(100, device=DEVICE)  # launched first, runs last
    with mod.stream(fast):
        state = mod.get_rng_state()  # taken while `first` is still queued
        second = torch.randn(100, device=DEVICE)
        mod.set_rng_state(state)
        again = torch.randn(100, device=DEVICE)
        third = torch.randn(100, device=DEVICE)
    mod.synchronize()
    assert torch.equal(first.cpu(), expected[0])
    assert torch.equal(second.cpu(), expected[1])
    assert torch.equal(again.cpu(), expected[1])
    assert torch.equal(third.cpu(), expected[2])
    mod.manual_seed(5)
    assert torch.equal(torch.randn(100, device=DEVICE).cpu(), expected[0])


@pytest.mark.parametrize("op", ["dropout", "bernoulli_tensor", "multinomial", "randperm"])
def test_random_ops_reproduce_under_manual_seed(mod, op):
    x = torch.rand(64, device=DEVICE) + 0.5

    def run(seed):
        mod.manual_seed(seed)
        return [RANDOM_OPS[op](x).cpu() for _ in range(2)]

    a, b, c = run(11), run(11), run(12)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], a[1])  # two calls draw differently
    assert not all(torch.equal(u, v) for u, v in zip(a, c))


def test_dropout_in_checkpoint_recomputes_the_same_mask(mod):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32).to(DEVICE)
    x0 = torch.randn(16, 32).to(DEVICE)

    def block(x):
        return F.dropout(lin(x), 0.5, training=True).relu()

    def grads(use_checkpoint):
        mod.manual_seed(3)
        lin.zero_grad()
        x = x0.clone().requires_grad_()
        y = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
        torch.rand(1000, device=DEVICE)  # the generator moves on before the recompute
        y.square().sum().backward()
        return y.detach().cpu(), x.grad.cpu(), lin.weight.grad.cpu()

    plain, recomputed = grads(False), grads(True)
    for a, b in zip(plain, recomputed):
        assert torch.equal(a, b)


def test_a_child_forked_before_the_device_starts_inherits_the_seed():
    code = f"""
import os, sys, torch
torch.manual_seed(21)  # deferred: the device is not initialised yet
pid = os.fork()
if pid == 0:
    print(torch.randn(4, device='{DEVICE}').tolist()); sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
print(torch.randn(4, device='{DEVICE}').tolist())
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    child, parent = out.stdout.split("\n")[:2]
    assert child == parent


@pytest.mark.skipif({{ cookiecutter.num_devices }} < 2, reason="needs two devices")
def test_each_device_has_a_generator_of_its_own(mod):
    mod.manual_seed_all(9)
    a = torch.randn(8, device=f"{DEVICE}:0")
    state1 = mod.get_rng_state(1)
    torch.randn(8, device=f"{DEVICE}:0")
    assert torch.equal(mod.get_rng_state(1), state1)  # drawing on device 0 leaves device 1's alone
    b = torch.randn(8, device=f"{DEVICE}:1")
    assert torch.equal(a.cpu(), b.cpu())  # same seed, same offset: the same draws


def test_a_random_kernels_argument_errors_are_raised_by_the_call():
    x = torch.empty(8, device=DEVICE)
    with pytest.raises(RuntimeError, match="std >= 0"):
        x.normal_(0.0, -1.0)
    with pytest.raises(RuntimeError, match="from"):
        x.uniform_(2.0, 1.0)
    with pytest.raises(RuntimeError, match="more than one element"):
        torch.empty(1, device=DEVICE).expand(8).bernoulli_(0.5)
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device=DEVICE), 5)
