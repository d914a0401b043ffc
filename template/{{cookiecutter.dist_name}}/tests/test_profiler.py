"""torch.profiler shows the {{ cookiecutter.device }} device: its kernels and copies, per device and stream.

A trace with ProfilerActivity.PrivateUse1 gets the device's side from csrc/runtime/profiler.cpp
(the driver's activity records, handed to Kineto): each kernel and copy the device ran, on its
device and stream, in the order the stream ran them, linked to the CPU op that launched it. A
trace of ProfilerActivity.CPU alone has none of them. The profiler's event-based fallback
(torch.autograd.profiler.profile(use_device=...)) times ops with device events instead.

The device's records need the driver's "tracing" capability (csrc/driver/driver.h), and the
kernels' records "host_tasks" too: the template's kernels are host code, which the driver sees
(and records) only when it runs as stream work; without it they run on the calling thread, and
so do the copies of host-mapped memory. The copies' names ("copy host to device") are those of
host-mapped memory: without "host_mapping" a copy is the driver's own memcpy, named by the driver.
"""

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tests.conftest import DEVICE, requires

N = 64
# The device's records and the CPU ops are timed by two clocks, converted to one: allow this much
# (microseconds) where a device event may start right as its op starts.
CLOCKS_US = 20

pytestmark = pytest.mark.usefixtures("drained")  # no queued work outlives a test

device_trace = requires("tracing", "host_tasks")  # the device's kernels and copies in a trace
named_copies = requires("tracing", "host_tasks", "host_mapping")  # ... and the copies' names


def device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def cpu_ops(prof):
    return {e.id: e for e in prof.events() if e.device_type == DeviceType.CPU}


def traced_workload(mod, side):
    """An add, a matmul, copies both ways and a multiply on a second stream, under a device trace."""
    x_host = torch.randn(N, N)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        x = x_host.to(DEVICE)  # host -> device
        y = x + x
        z = torch.matmul(y, x)
        with mod.stream(side):
            side.wait_stream(torch.accelerator.current_stream())
            w = z * 2
        torch.accelerator.current_stream().wait_stream(side)
        result = w.cpu()  # device -> host
    torch.testing.assert_close(result, ((x_host + x_host) @ x_host) * 2)
    return prof


@named_copies
def test_a_trace_shows_the_devices_kernels_and_copies(mod):
    side = torch.Stream(device=DEVICE)
    prof = traced_workload(mod, side)
    events = device_events(prof)
    ops = cpu_ops(prof)
    assert events, "no device events in a trace with ProfilerActivity.PrivateUse1"

    def launched_by(name):
        return [e for e in events if e.linked_correlation_id in ops and ops[e.linked_correlation_id].name == name]

    kernels = [e for e in events if e.activity_type == "kernel"]
    copies = [e for e in events if e.activity_type == "gpu_memcpy"]
    assert any("add" in e.name for e in kernels), [e.name for e in kernels]
    assert launched_by("aten::add") and launched_by("aten::mm") and launched_by("aten::mul")
    assert {e.name for e in copies} >= {"copy host to device", "copy device to host"}
    assert all(e.device_index == 0 for e in events)
    # the multiply ran on the side stream, everything else on the default stream
    assert {e.device_resource_id for e in launched_by("aten::mul")} == {side.stream_id}
    assert {e.device_resource_id for e in launched_by("aten::add")} == {0}

    # the CPU ops carry their device time (key_averages' device columns)
    add = [e for e in ops.values() if e.name == "aten::add"]
    assert add and add[0].kernels and add[0].device_time_total > 0
    assert prof.key_averages().table(sort_by="device_time_total")  # renders with the device's columns


@named_copies
def test_device_events_follow_their_cpu_op_and_keep_their_streams_order(mod):
    side = torch.Stream(device=DEVICE)
    prof = traced_workload(mod, side)
    events = device_events(prof)
    ops = cpu_ops(prof)
    linked = [e for e in events if e.linked_correlation_id in ops]
    assert len(linked) == len(events), "every device event names the CPU op that launched it"
    for e in linked:  # on one clock: the device starts the work after the host asked for it
        assert e.time_range.start >= ops[e.linked_correlation_id].time_range.start - CLOCKS_US
    by_stream = {}
    for e in events:
        by_stream.setdefault(e.device_resource_id, []).append(e)
    for stream_events in by_stream.values():  # a stream runs one op's work at a time, in launch order
        stream_events.sort(key=lambda e: e.time_range.start)
        for earlier, later in zip(stream_events, stream_events[1:]):
            assert earlier.linked_correlation_id <= later.linked_correlation_id
            if earlier.linked_correlation_id != later.linked_correlation_id:  # (one op's copies may
                assert earlier.time_range.end <= later.time_range.start  # run inside its kernel)
    default = [ops[e.linked_correlation_id].name for e in sorted(by_stream[0], key=lambda e: e.time_range.start)]
    assert default.index("aten::add") < default.index("aten::mm") < len(default) - 1
    assert "copy device to host" == sorted(by_stream[0], key=lambda e: e.time_range.start)[-1].name


@requires("spin", "tracing", "host_tasks", "host_mapping")  # _sleep, named_copies
def test_queued_work_shows_when_the_device_ran_it(mod):
    x = torch.ones(N, device=DEVICE)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        mod._sleep(50_000)
        y = x.clone()  # a copy within the device is queued: the host returns at once
        mod.synchronize()
    assert torch.equal(y.cpu(), torch.ones(N))
    ops = cpu_ops(prof)
    events = device_events(prof)
    (sleep,) = [e for e in events if e.name == "sleep"]
    (copy,) = [e for e in events if e.name == "copy device to device"]
    assert sleep.time_range.end - sleep.time_range.start >= 45_000
    assert copy.time_range.start >= sleep.time_range.end  # the stream ran it after the sleep,
    assert copy.time_range.start > ops[copy.linked_correlation_id].time_range.end  # long after its op returned


@device_trace
def test_a_second_device_has_its_own_rows(mod):
    if mod.device_count() < 2:
        pytest.skip("one device")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        a = torch.ones(N, device=f"{DEVICE}:0") + 1
        b = torch.ones(N, device=f"{DEVICE}:1") + 1
        mod.synchronize(1)
    adds = [e for e in device_events(prof) if "add" in e.name]
    assert {e.device_index for e in adds} == {0, 1}
    assert torch.equal(a.cpu(), b.cpu())


def test_a_cpu_only_trace_has_no_device_events(mod):
    x = torch.randn(N, N, device=DEVICE)
    traced_workload(mod, torch.Stream(device=DEVICE))  # the device's profiler is known to Kineto now
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = (x + x).cpu()
    assert y.shape == (N, N)
    assert any(e.name == "aten::add" for e in prof.events())
    assert device_events(prof) == []
    assert all(not e.kernels for e in prof.events())


@device_trace
def test_the_chrome_trace_has_device_rows_linked_to_cpu_ops(mod, tmp_path):
    side = torch.Stream(device=DEVICE)
    prof = traced_workload(mod, side)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    cpu = {e["args"]["External id"]: e for e in trace if e.get("cat") == "cpu_op"}
    device = [e for e in trace if e.get("cat") in ("kernel", "gpu_memcpy")]
    assert {e["cat"] for e in device} == {"kernel", "gpu_memcpy"}
    assert {e["pid"] for e in device} == {0}  # the device's row: its index
    assert {e["tid"] for e in device} == {0, side.stream_id}  # one row per stream
    for e in device:
        op = cpu[e["args"]["External id"]]
        assert e["ts"] >= op["ts"] - CLOCKS_US
    names = {e["args"]["name"] for e in trace if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == 0}
    assert f"stream {side.stream_id}" in names


def test_the_event_fallback_times_ops_on_the_device(mod):
    x = torch.randn(256, 256, device=DEVICE)
    with torch.autograd.profiler.profile(use_device=DEVICE) as prof:  # without Kineto's device tracing
        y = torch.matmul(x, x)
        mod.synchronize()
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert mm and mm[0].is_legacy
    assert mm[0].device_time_total > 0
    assert y.shape == (256, 256)
