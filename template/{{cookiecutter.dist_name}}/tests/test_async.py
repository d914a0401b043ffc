"""The device is asynchronous: what a missing synchronize, wait or record_stream does here.

Each stream's work — kernels, copies, event records — runs in order on the device's worker thread
and launching returns at once, so these tests show the bugs a team would otherwise meet first on
silicon: an event that is not yet complete, a stream reading another's output without waiting, a
non_blocking copy read before a synchronize, memory reused while a kernel on another stream still
reads it, an error inside a kernel reported later, and host code touching device memory. `_sleep`
or a row of large kernels keeps a stream busy long enough to make each outcome certain.

Each premise needs the driver's optional capabilities (csrc/driver/driver.h): `_sleep` needs
"spin"; kernels queued on a stream need "host_tasks" on "host_mapping" memory (queued_kernels);
copies queue unless host_mapping makes them host code without host_tasks (queued_copies). On a
driver without them (the minimal driver has none) those tests skip, naming what is missing.
"""

import gc
import signal

import pytest
import torch

from tests.conftest import (
    DEVICE,
    fresh_process,
    queued_copies,
    queued_kernels,
    requires,
)

BUSY_US = 100_000  # long enough that the host finishes its part (microseconds) while the stream still sleeps
N = 4096

pytestmark = pytest.mark.usefixtures("drained")  # no queued work outlives a test


@requires("spin")
def test_an_event_is_not_complete_until_its_stream_reaches_it(mod):
    s = torch.Stream(device=DEVICE)
    with mod.stream(s):
        mod._sleep(BUSY_US)
        e = s.record_event()
    assert not e.query()
    assert not s.query()
    e.synchronize()
    assert e.query() and s.query()


@requires("spin")
def test_elapsed_time_measures_the_work_between_two_events(mod):
    start = torch.Event(device=DEVICE, enable_timing=True)
    end = torch.Event(device=DEVICE, enable_timing=True)
    start.record()
    mod._sleep(50_000)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 45.0


@requires("spin")
@queued_copies
def test_a_stream_sees_another_streams_writes_only_after_waiting(mod):
    src = torch.ones(N, device=DEVICE)
    dst = torch.zeros(N, device=DEVICE)
    side = torch.Stream(device=DEVICE)
    with mod.stream(side):
        mod._sleep(BUSY_US)
        dst.copy_(src)  # queued behind the sleep
    early = dst.clone()  # the current stream does not wait for `side`: it copies the zeros
    torch.accelerator.current_stream().wait_stream(side)
    late = dst.clone()  # ordered after side's copy
    assert torch.equal(early.cpu(), torch.zeros(N))
    assert torch.equal(late.cpu(), torch.ones(N))


@requires("spin")
def test_waiting_on_an_event_orders_two_streams(mod):
    a, b = torch.Stream(device=DEVICE), torch.Stream(device=DEVICE)
    x = torch.zeros(N, device=DEVICE)
    with mod.stream(a):
        mod._sleep(BUSY_US)
        x.copy_(torch.full((N,), 3.0, device=DEVICE))
        done = a.record_event()
    with mod.stream(b):
        b.wait_event(done)
        y = x * 2  # queued on b, after a's copy
    torch.accelerator.current_stream().wait_stream(b)  # y is b's: the current stream waits for it
    assert torch.equal(y.cpu(), torch.full((N,), 6.0))


@requires("spin")
@queued_copies
def test_a_non_blocking_copy_to_pinned_memory_needs_a_synchronize(mod):
    d = torch.full((N,), 7.0, device=DEVICE)
    host = torch.zeros(N).pin_memory()
    mod._sleep(BUSY_US)
    host.copy_(d, non_blocking=True)
    assert torch.equal(host, torch.zeros(N))  # not yet: the copy waits behind the sleep
    torch.accelerator.current_stream().synchronize()
    assert torch.equal(host, torch.full((N,), 7.0))


@requires("spin")
def test_pinned_memory_a_queued_copy_reads_is_not_reused_before_the_copy_ran(mod):
    # The pinned block is freed while a non_blocking copy still waits to read it; a new pinned
    # tensor of the same size must get other memory (the host allocator's event gates reuse), or
    # refilling it would change what the device receives.
    src = torch.arange(N, dtype=torch.float32).pin_memory()
    dst = torch.empty(N, device=DEVICE)
    mod._sleep(BUSY_US)
    dst.copy_(src, non_blocking=True)
    del src
    refill = torch.empty(N, dtype=torch.float32).pin_memory()
    refill.fill_(-1.0)
    mod.synchronize()
    assert torch.equal(dst.cpu(), torch.arange(N, dtype=torch.float32))
    # once the copy ran, the cached block is handed out again (and empty_host_cache releases it)
    again = torch.empty(N, dtype=torch.float32).pin_memory()
    assert again.is_pinned()
    del refill, again
    torch.accelerator.empty_host_cache()


@requires("spin")
def test_a_blocking_copy_waits_for_the_stream(mod):
    d = torch.zeros(N, device=DEVICE)
    mod._sleep(BUSY_US)
    d.copy_(torch.full((N,), 5.0, device=DEVICE))
    assert torch.equal(d.cpu(), torch.full((N,), 5.0))  # .cpu() is ordered after the queued copy


def _free_while_another_stream_reads(mod, record: bool) -> torch.Tensor:
    """x is read by a copy queued on `side` (behind a sleep); x is freed meanwhile and a tensor
    of the same size is allocated and written on the current stream. Returns what side read."""
    side = torch.Stream(device=DEVICE)
    x = torch.ones(N, device=DEVICE)
    out = torch.empty(N, device=DEVICE)
    side.wait_stream(torch.accelerator.current_stream())
    with mod.stream(side):
        mod._sleep(BUSY_US)
        out.copy_(x)  # reads x later
    if record:
        x.record_stream(side)
    del x
    reused = torch.empty(N, device=DEVICE)  # x's block if nothing keeps it
    reused.fill_(-1.0)
    side.synchronize()
    return out.cpu()


@requires("spin")
def test_record_stream_keeps_memory_from_reuse_until_the_other_stream_is_done(mod):
    assert torch.equal(_free_while_another_stream_reads(mod, record=True), torch.ones(N))


@requires("spin")
@queued_copies
def test_without_record_stream_the_memory_is_reused_while_another_stream_reads_it(mod):
    # The bug record_stream exists for, caught here: the side stream reads the new owner's values.
    assert torch.equal(_free_while_another_stream_reads(mod, record=False), torch.full((N,), -1.0))


# ---- kernels are queued too: the same bugs, with kernels instead of copies -------------------------

BIG = 1 << 22


def _keep_busy(k: int = 16) -> list:
    """Queues k kernels of 4M elements each on the current stream; the host returns at once."""
    big = torch.ones(BIG, device=DEVICE)
    return [big * 2 for _ in range(k)]


@queued_kernels
def test_an_event_is_not_complete_while_kernels_are_queued(mod):
    busy = _keep_busy()
    done = torch.Event(device=DEVICE)
    done.record()
    assert not done.query()  # the host got here long before the device ran the kernels
    done.synchronize()
    assert done.query() and torch.equal(busy[-1][:4].cpu(), torch.full((4,), 2.0))


@queued_kernels
def test_a_kernels_result_on_another_stream_is_seen_only_after_wait_stream(mod):
    side = torch.Stream(device=DEVICE)
    src, dst = torch.ones(N, device=DEVICE), torch.zeros(N, device=DEVICE)
    side.wait_stream(torch.accelerator.current_stream())
    with mod.stream(side):
        busy = _keep_busy()
        torch.mul(src, 2, out=dst)  # queued on side, behind the busy kernels
    early = dst.cpu()  # the current stream does not wait for side: the missing wait_stream
    torch.accelerator.current_stream().wait_stream(side)
    late = dst.cpu()
    assert torch.equal(early, torch.zeros(N))
    assert torch.equal(late, torch.full((N,), 2.0))
    del busy


@queued_kernels
@pytest.mark.parametrize("dims", [3, 7])  # within what a launch keeps inline (5), and past it
def test_a_queued_kernel_reads_its_arguments_as_they_were_at_launch(mod, dims):
    x = torch.randn((2,) * dims, generator=torch.Generator().manual_seed(dims))
    y = torch.randn((2,) * dims, generator=torch.Generator().manual_seed(dims + 1))
    a, b = x.to(DEVICE).transpose(0, dims - 1), y.to(DEVICE)
    done = torch.Event(device=DEVICE)
    busy = _keep_busy()
    c = a + b  # queued behind the busy kernels
    done.record()
    a.transpose_(0, 1)  # the host changes the tensors' geometry before the kernel runs
    b.unsqueeze_(0)
    assert not done.query()
    assert torch.equal(c.cpu(), x.transpose(0, dims - 1) + y)
    del busy


def _kernel_reads_a_freed_input(mod, record: bool) -> torch.Tensor:
    """A kernel queued on `side` reads x; x is freed meanwhile and its memory handed out again on
    the current stream. Returns what the kernel computed."""
    side = torch.Stream(device=DEVICE)
    x = torch.ones(N, device=DEVICE)
    after = torch.empty(N, device=DEVICE)  # x's block cannot merge with free space after it
    side.wait_stream(torch.accelerator.current_stream())
    with mod.stream(side):
        # The device is busy on side and runs the current stream's work meanwhile (its one worker
        # would otherwise run side's queued kernels in one go, before the current stream's fill).
        mod._sleep(BUSY_US)
        y = x * 3  # a kernel: the host returns at once, and it reads x when it runs
    if record:
        x.record_stream(side)
    del x
    reused = torch.empty(N, device=DEVICE)  # x's block if nothing keeps it
    reused.fill_(-1.0)
    side.synchronize()
    del after
    return y.cpu()


@requires("spin", "host_tasks", "host_mapping")  # _sleep, queued_kernels
def test_an_input_freed_early_is_corrupted_without_record_stream(mod):
    # As on a chip, a queued kernel does not keep its inputs alive: it read the new owner's values.
    assert torch.equal(_kernel_reads_a_freed_input(mod, record=False), torch.full((N,), -3.0))


@requires("spin")
def test_record_stream_keeps_a_kernels_input_until_the_kernel_ran(mod):
    assert torch.equal(_kernel_reads_a_freed_input(mod, record=True), torch.full((N,), 3.0))


@queued_kernels
def test_an_error_inside_a_queued_kernel_is_raised_at_the_next_synchronize(mod):
    logp = torch.randn(4, 5, device=DEVICE).log_softmax(1)
    target = torch.tensor([0, 1, 7, 2], device=DEVICE)  # 7 is out of range: only the kernel looks
    torch.nn.functional.nll_loss(logp, target)  # a launch: returns before the kernel ran
    # as CUDA reports an asynchronous error (torch.AcceleratorError, a RuntimeError), naming the kernel
    with pytest.raises(torch.AcceleratorError, match=r"nll_loss.*Target 7 is out of bounds"):
        mod.synchronize()
    assert torch.equal((torch.ones(2, device=DEVICE) * 3).cpu(), torch.full((2,), 3.0))  # reported once


def test_the_caching_allocator_keeps_freed_memory_until_empty_cache(mod):
    # device tensors an earlier test left in garbage cycles (a pytest.raises' traceback) would be
    # freed whenever the collector next runs, in the middle of this test's accounting
    gc.collect()
    mod.empty_cache()
    reserved = torch.accelerator.memory_stats(0)["reserved_bytes.all.current"]
    x = torch.empty(8 << 20, dtype=torch.uint8, device=f"{DEVICE}:0")
    ptr = x.data_ptr()
    del x
    stats = torch.accelerator.memory_stats(0)
    assert stats["reserved_bytes.all.current"] >= reserved + (8 << 20)  # cached, not returned
    assert torch.empty(8 << 20, dtype=torch.uint8, device=f"{DEVICE}:0").data_ptr() == ptr  # reused
    mod.empty_cache()
    assert torch.accelerator.memory_stats(0)["reserved_bytes.all.current"] == reserved


HOST_READS_DEVICE_MEMORY = fresh_process(
    "import ctypes, torch, {{ cookiecutter.package }}\n"
    "t = torch.ones(16, device='{{ cookiecutter.device }}')\n"
    "print(ctypes.c_float.from_address(t.data_ptr()).value)\n"
)


def test_host_code_cannot_touch_device_memory_by_accident():
    # Reading a device pointer on the host is a crash here, as on a real accelerator.
    out = HOST_READS_DEVICE_MEMORY.result()
    assert out.returncode == -signal.SIGSEGV, (out.returncode, out.stdout, out.stderr[-2000:])


# Several threads launching onto one stream at once, each pausing now and then long enough for the
# device's worker to go to sleep (its idle spin is 50 us): every launch runs, in its thread's order,
# and none is left behind a worker asleep (a lost wake-up would hang the synchronize: the process
# then ends by faulthandler's timer, with a traceback, instead of printing).
MANY_THREADS_LAUNCH = fresh_process(
    "import faulthandler, threading, time, torch, {{ cookiecutter.package }}\n"
    "faulthandler.dump_traceback_later(120, exit=True)\n"
    "def chain(x, n):\n"
    "    for k in range(n):\n"
    "        x.mul_(0.5).add_(k % 7)  # each launch reads the one before: order shows in the value\n"
    "        if k % 400 == 0:\n"
    "            time.sleep(0.002)\n"
    "    return x\n"
    "outs = [torch.zeros(16, dtype=torch.float64, device='{{ cookiecutter.device }}') for _ in range(4)]\n"
    "threads = [threading.Thread(target=chain, args=(x, 3000)) for x in outs]\n"
    "for t in threads: t.start()\n"
    "for t in threads: t.join()\n"
    "torch.{{ cookiecutter.device }}.synchronize()\n"
    "want = chain(torch.zeros(16, dtype=torch.float64), 3000)\n"
    "print(all(torch.equal(x.cpu(), want) for x in outs))\n"
)


def test_launches_from_several_threads_onto_one_stream_all_run_in_order():
    out = MANY_THREADS_LAUNCH.result()
    assert out.returncode == 0 and out.stdout.strip() == "True", (out.returncode, out.stdout, out.stderr[-2000:])
