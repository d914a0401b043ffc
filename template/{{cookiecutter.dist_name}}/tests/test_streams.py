"""torch.Stream, torch.Event and torch.accelerator on the device."""

import pytest
import torch

from tests.conftest import DEVICE, requires


def test_streams():
    s = torch.Stream(device=DEVICE)
    assert s.device.type == DEVICE
    default = torch.accelerator.current_stream()
    torch.accelerator.set_stream(s)
    assert torch.accelerator.current_stream() == s
    torch.accelerator.set_stream(default)
    assert s.query()
    s.synchronize()
    # the handle generated code passes to the SDK (Inductor's get_raw_stream): one per stream
    assert isinstance(s.native_handle, int) and s.native_handle != default.native_handle


def test_events_and_elapsed_time():
    start = torch.Event(device=DEVICE, enable_timing=True)
    end = torch.Event(device=DEVICE, enable_timing=True)
    start.record()
    x = torch.randn(256, 256, device=DEVICE)
    x = x + x
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0.0


def test_stream_wait_event():
    s1, s2 = torch.Stream(device=DEVICE), torch.Stream(device=DEVICE)
    e = torch.Event(device=DEVICE)
    e.record(s1)
    s2.wait_event(e)
    s2.synchronize()


POOL = 32  # streams per device and priority (csrc/runtime/guard.cpp)


def test_streams_come_from_a_pool_per_priority(mod):
    # A real device has few hardware queues: new streams cycle through a fixed pool, not one
    # driver stream per request.
    ids = [torch.Stream(device=DEVICE).stream_id for _ in range(2 * POOL)]
    assert len(set(ids)) == POOL
    assert ids[:POOL] == ids[POOL:]
    high = [torch.Stream(device=DEVICE, priority=-1).stream_id for _ in range(POOL)]
    assert not set(high) & set(ids)  # the high-priority pool is another pool


def test_stream_priorities(mod):
    least, greatest = mod.Stream.priority_range()
    assert greatest < least
    assert mod.Stream().priority == least
    assert mod.Stream(priority=greatest).priority == greatest
    assert mod.Stream(priority=greatest - 10).priority == greatest  # clamped, as on CUDA
    high = torch.Stream(device=DEVICE, priority=-1)
    assert mod.Stream(stream_id=high.stream_id, device_index=high.device_index,
                      device_type=high.device_type).priority == max(greatest, -1)
    assert mod.current_stream().priority == least  # the default stream


@requires("spin")
def test_stream_and_event_classes_behave_like_cudas(mod):
    s = mod.Stream(device=f"{DEVICE}:1" if mod.device_count() > 1 else DEVICE)
    assert isinstance(s, torch.Stream) and s.device.type == DEVICE
    t = mod.Stream()
    assert t.device_index == mod.current_device()
    start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    with mod.stream(t):
        assert mod.current_stream() == t
        start.record()
        mod._sleep(100_000)
        end.record()
    assert mod.current_stream() != t
    assert not end.query() and not t.query()
    u = mod.Stream()
    u.wait_event(end)
    done = u.record_event()
    assert isinstance(done, mod.Event)
    assert not done.query()  # u waits for t's sleep
    done.synchronize()
    assert end.query() and t.query() and u.query()
    assert start.elapsed_time(end) >= 90.0
    v = mod.Stream()
    with mod.stream(t):
        mod._sleep(50_000)
    v.wait_stream(t)
    e = mod.Event()
    e.record(v)
    assert not e.query()
    v.synchronize()
    assert e.query()
    mod.default_stream().synchronize()
