"""The CPU fallback is a launch where it can be (csrc/aten/fallback.cpp, "queued calls"): an operator
without a {{ cookiecutter.device }} kernel whose results the host can decide without the data (its meta kernel)
queues its CPU kernel on the stream and returns, as a native kernel does, instead of waiting for
the stream to drain. Its argument errors are still raised by the call itself, on the host; what
needs the data (nonzero, item) still waits.

The fallback runs an exact call on meta tensors only from its second time, and queues a kind of
call only once a synchronous run showed its meta kernel agreeing with its CPU kernel, so each test
repeats its call before it looks at the queue.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import DEVICE, queued_kernels, requires

BUSY_US = 300_000  # the stream sleeps while the host makes a call that must wait for it

pytestmark = pytest.mark.usefixtures("drained")

# operators with no kernel in the template's default list: they reach the CPU fallback
OPS = {
    "sigmoid": (lambda x: torch.sigmoid(x), (64, 32)),
    "tanh": (lambda x: torch.tanh(x), (64, 32)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), (2, 4, 16, 16)),
    "cat": (lambda x: torch.cat([x, x * 2], dim=1), (8, 5)),
}


def warm(fn, x, mod, times=3):
    for _ in range(times):
        fn(x)
    mod.synchronize()


@queued_kernels
@pytest.mark.parametrize("name", list(OPS))
def test_a_fallback_operator_does_not_wait_for_the_stream(mod, name):
    fn, shape = OPS[name]
    x = torch.randn(shape)
    xd = x.to(DEVICE)
    warm(fn, xd, mod)
    with mod._held_stream():  # a call that waits for the stream returns only after the hold's timeout
        out = fn(xd)
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query(), f"{name} waited for the stream to drain"
    mod.synchronize()
    torch.testing.assert_close(out.cpu(), fn(x))
    assert out.device.type == DEVICE and out.shape == fn(x).shape and out.stride() == fn(x).stride()


@queued_kernels
def test_out_and_in_place_fallback_calls_are_queued_and_write_their_argument(mod):
    x = torch.randn(32, 8)
    xd = x.to(DEVICE)
    out = torch.empty(32, 8, device=DEVICE)
    y = xd.clone()
    for _ in range(3):
        torch.tanh(xd, out=out)
        y.copy_(xd).sigmoid_()
    mod.synchronize()
    with mod._held_stream():
        y.copy_(xd)
        returned = torch.tanh(xd, out=out)
        y.sigmoid_()
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query()
    assert returned is out
    mod.synchronize()
    torch.testing.assert_close(out.cpu(), torch.tanh(x))
    torch.testing.assert_close(y.cpu(), torch.sigmoid(x))


def test_a_fallback_operator_gives_the_cpu_result_call_after_call(mod):
    x = torch.randn(4, 3, 10, 10)
    xd = x.to(DEVICE)
    for _ in range(5):  # sync, then judged, then queued (where the driver queues)
        got = F.max_pool2d(torch.tanh(xd), 2)
        torch.testing.assert_close(got.cpu(), F.max_pool2d(torch.tanh(x), 2))
    nc = xd.transpose(2, 3)  # another kind of argument: judged again
    for _ in range(3):
        torch.testing.assert_close(torch.sigmoid(nc).cpu(), torch.sigmoid(x.transpose(2, 3)))
        assert torch.sigmoid(nc).stride() == torch.sigmoid(x.transpose(2, 3)).stride()


def test_argument_errors_of_fallback_operators_are_raised_by_the_call(mod):
    a, b = torch.ones(2, 3, device=DEVICE), torch.ones(2, 4, device=DEVICE)
    for _ in range(3):
        torch.cat([a, a], dim=0)
    for _ in range(3):  # the first time without a meta pass, then with one: raised by the call either way
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
            torch.cat([a, b], dim=0)
    x = torch.randn(5, device=DEVICE)
    wrong = torch.empty(5, dtype=torch.long, device=DEVICE)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            torch.tanh(x, out=wrong)
    mod.synchronize()  # nothing failed in the queue
    assert torch.cat([a, a], dim=0).cpu().tolist() == [[1.0] * 3] * 4


def test_an_out_the_operator_resizes_is_resized(mod):
    x = torch.randn(6)
    xd = x.to(DEVICE)
    for _ in range(3):
        out = torch.empty(0, device=DEVICE)
        torch.tanh(xd, out=out)
        assert out.shape == (6,)
        torch.testing.assert_close(out.cpu(), torch.tanh(x))
    for _ in range(3):  # an out with elements: resized with the CPU's warning (the call then waits)
        out = torch.empty(2, 2, device=DEVICE)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            torch.tanh(xd, out=out)
        assert out.shape == (6,)
        torch.testing.assert_close(out.cpu(), torch.tanh(x))


@queued_kernels
def test_an_empty_out_the_operator_resizes_is_queued(mod):
    # every composite factory ends in an out= call on an empty tensor (torch.eye: eye.out, torch.polar:
    # polar.out), as does the out= idiom on torch.empty(0): the host gives the out the meta kernel's
    # size, so the call is a launch, and the caller sees the size at once
    a, b = torch.rand(5, 3), torch.randn(5, 3)
    ad, bd = a.to(DEVICE), b.to(DEVICE)

    def calls():
        out = torch.empty(0, device=DEVICE)
        torch.tanh(bd, out=out)
        return torch.eye(7, 4, device=DEVICE), torch.polar(ad, bd), out

    for _ in range(3):
        calls()
    mod.synchronize()
    with mod._held_stream():
        eye, polar, out = calls()
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query(), "a call on an empty out= waited for the stream"
        assert eye.shape == (7, 4) and polar.shape == (5, 3) and polar.dtype == torch.complex64 and out.shape == (5, 3)
    mod.synchronize()
    torch.testing.assert_close(eye.cpu(), torch.eye(7, 4))
    torch.testing.assert_close(polar.cpu(), torch.polar(a, b))
    torch.testing.assert_close(out.cpu(), torch.tanh(b))


@queued_kernels
def test_a_factory_through_the_fallback_is_queued(mod):
    # torch.tril_indices and triu_indices: CPU kernels with a device= argument and no tensor argument,
    # so nothing they compute depends on the device's data: the CPU kernel runs on the host at once,
    # and its results reach the device by a copy queued on the current stream
    def calls():
        return torch.tril_indices(5, 4, 1, device=DEVICE), torch.triu_indices(4, 6, -1, device=DEVICE)

    calls()
    mod.synchronize()
    with mod._held_stream(timeout_s=3.0):
        tril, triu = calls()
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query(), "a factory call through the fallback waited for the stream"
        assert tril.device.type == DEVICE and tril.shape == torch.tril_indices(5, 4, 1).shape
    mod.synchronize()
    assert torch.equal(tril.cpu(), torch.tril_indices(5, 4, 1))
    assert torch.equal(triu.cpu(), torch.triu_indices(4, 6, -1))


@requires("spin")
def test_an_operator_whose_result_size_depends_on_the_data_still_waits(mod):
    x = torch.tensor([0.0, 1.0, 0.0, 2.0])
    xd = x.to(DEVICE)
    for _ in range(3):
        torch.nonzero(xd)
    mod._sleep(BUSY_US)
    y = torch.sigmoid(xd) * 0  # queued behind the sleep (or run at once, without host_tasks)
    got = torch.nonzero(y + xd)  # waits for them: its size is the data's
    assert got.cpu().flatten().tolist() == [1, 3]
