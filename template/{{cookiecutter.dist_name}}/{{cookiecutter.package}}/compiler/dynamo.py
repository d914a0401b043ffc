"""Dynamo's device interface for {{ cookiecutter.device }}: what torch.compile asks of the runtime.

Dynamo and Inductor reach a device's runtime only through a `DeviceInterface` class registered
for the device's name: the current device, device count, streams and events (so
`with torch.{{ cookiecutter.device }}.stream(s):` traces), synchronize, and the device's properties
(Inductor sizes its reductions by `multi_processor_count`). Everything here forwards to
`torch.{{ cookiecutter.device }}` (device_module.py), so a hardware team changes nothing in this file: its runtime
answers through the same functions. Registered by compiler/__init__.py once Dynamo is imported.
"""

from __future__ import annotations

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

from {{ cookiecutter.package }} import _C
from {{ cookiecutter.package }} import device_module as _mod

DEVICE = "{{ cookiecutter.device }}"
_worker_device: dict[str, int] = {}


class {{ cookiecutter.device | capitalize }}Interface(DeviceInterface):
    device = _mod.device
    Stream = _mod.Stream
    Event = _mod.Event

    class Worker:
        """What Inductor's compile workers ask (processes that must not use the device: the
        device they work for is only recorded)."""

        @staticmethod
        def set_device(device: int) -> None:
            _worker_device["index"] = device

        @staticmethod
        def current_device() -> int:
            return _worker_device.get("index", _C.current_device())

        @staticmethod
        def get_device_properties(device=None):
            return _mod.get_device_properties(device)

    current_device = staticmethod(_mod.current_device)
    set_device = staticmethod(_mod.set_device)
    device_count = staticmethod(_mod.device_count)
    is_available = staticmethod(_mod.is_available)
    synchronize = staticmethod(_mod.synchronize)
    stream = staticmethod(_mod.stream)
    current_stream = staticmethod(_mod.current_stream)
    set_stream = staticmethod(_mod.set_stream)
    get_device_properties = staticmethod(_mod.get_device_properties)
    memory_allocated = staticmethod(_mod.memory_allocated)
    is_bf16_supported = staticmethod(_mod.is_bf16_supported)

    @staticmethod
    def exchange_device(device: int) -> int:
        return _C.exchange_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return _C.exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _mod.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_index: int) -> int:
        """The handle generated code passes to its kernels (the C++ kernels inductor.py generates take none)."""
        return _mod.current_stream(device_index).native_handle

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return _mod.get_device_capability(device)

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False


def register() -> None:
    register_interface_for_device(DEVICE, {{ cookiecutter.device | capitalize }}Interface)
