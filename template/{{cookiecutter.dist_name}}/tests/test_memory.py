"""Device allocator statistics, out-of-memory, pinned host memory, threads."""

import gc
import threading

import pytest
import torch

from tests.conftest import DEVICE, requires


def test_allocator_stats(mod):
    gc.collect()  # earlier tests' garbage (tensors in reference cycles) is not freed mid-test
    torch.accelerator.reset_peak_memory_stats(0)
    before = torch.accelerator.memory_allocated(0)
    x = torch.empty(1024, 1024, device=f"{DEVICE}:0")  # 4 MiB
    assert torch.accelerator.memory_allocated(0) - before == 4 * 1024 * 1024
    assert torch.accelerator.max_memory_allocated(0) >= before + 4 * 1024 * 1024
    stats = torch.accelerator.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated(0)
    del x
    assert torch.accelerator.memory_allocated(0) == before
    torch.accelerator.empty_cache()


def test_a_lazy_clone_shares_memory_until_one_side_is_written(mod):
    # copy-on-write (torch._lazy_clone) shares only a storage whose DataPtr's context is its data
    # pointer (Allocator::is_simple_data_ptr), and takes the context over as the data pointer when
    # the last reference is written: the device allocator's context must stay the address
    gc.collect()
    x = torch.arange(262144, dtype=torch.float32, device=f"{DEVICE}:0")  # 1 MiB
    before = torch.accelerator.memory_allocated(0)
    y = torch._lazy_clone(x)
    assert torch.accelerator.memory_allocated(0) == before  # nothing copied yet
    y.add_(1)  # the write gives y memory of its own
    assert torch.accelerator.memory_allocated(0) == before + 1024 * 1024
    assert torch.equal(x.cpu(), torch.arange(262144, dtype=torch.float32))
    assert torch.equal(y.cpu(), torch.arange(262144, dtype=torch.float32) + 1)
    del x, y
    assert torch.accelerator.memory_allocated(0) == before - 1024 * 1024


@requires("memory_limit")
def test_out_of_memory_is_torch_oom_and_the_process_continues(mod):
    free, total = mod.mem_get_info(0)
    mod.set_memory_limit(64 * 1024 * 1024, 0)
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate \d+ bytes .* bytes free"):
            torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=f"{DEVICE}:0")
        y = torch.ones(16, device=f"{DEVICE}:0")  # still usable
        assert y.sum().item() == 16
    finally:
        mod.set_memory_limit(total, 0)


@requires("memory_limit")
def test_bad_memory_limits_are_refused(mod):
    with pytest.raises(OverflowError):
        mod.set_memory_limit(-1, 0)
    with pytest.raises(RuntimeError, match="device index is out of range"):
        mod.set_memory_limit(1024, mod.device_count())
    free, total = mod.mem_get_info(0)
    assert 0 < free <= total


def test_pinned_memory():
    x = torch.randn(64)
    p = x.pin_memory(DEVICE) if "device" in torch.Tensor.pin_memory.__doc__ else x.pin_memory()
    assert p.is_pinned()
    assert not x.is_pinned()
    assert torch.equal(p, x)
    d = p.to(DEVICE, non_blocking=True)
    assert torch.equal(d.cpu(), x)


def test_pinned_is_recognised_anywhere_inside_a_block():
    # a storage sliced out of a pinned one starts past the block's first byte
    p = torch.randn(64).pin_memory()
    inner = p.untyped_storage()[16:]
    assert inner.is_pinned() and torch.empty(0).set_(inner).is_pinned()
    assert not torch.randn(64).untyped_storage()[16:].is_pinned()


def run_in_threads(work, n=4):
    """Run `work` in n threads at once; re-raise the first exception any of them met."""
    errors = []

    def guarded():
        try:
            work()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_threads_allocate_and_free_with_consistent_stats():
    before = torch.accelerator.memory_allocated(0)

    def work():
        for i in range(200):
            t = torch.full((256,), float(i), device=f"{DEVICE}:0")
            assert t[0].item() == float(i)
            del t

    run_in_threads(work)
    assert torch.accelerator.memory_allocated(0) == before  # nothing leaked


def test_streams_from_threads():
    def work():
        s = torch.Stream(device=DEVICE)
        with s:
            assert torch.ones(8, device=DEVICE).add_(1).sum().item() == 16
        s.synchronize()

    run_in_threads(work)
