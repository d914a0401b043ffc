"""torch.Stream, torch.Event and torch.accelerator on the device."""

import torch

from tests.conftest import DEVICE


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
