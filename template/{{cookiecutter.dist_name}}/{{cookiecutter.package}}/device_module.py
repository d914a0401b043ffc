"""`torch.{{ cookiecutter.device }}`: the device module PyTorch looks up by the backend's name.

Devices (is_available, device_count, current_device, set_device, the `device` context manager,
synchronize), streams and events under torch.cuda's names (`Stream`, `Event`, `current_stream`,
`stream`: FSDP calls them), memory (statistics, capacity), the CPU fallback's counters, and — re-exported from
their own modules — random number generation and autocast support. What a hardware team replaces:
nothing; these call into the C++ runtime.
"""

from __future__ import annotations

import torch

from {{ cookiecutter.package }} import _C
from {{ cookiecutter.package }}._utils import device_index as _index
from {{ cookiecutter.package }}.amp import get_amp_supported_dtype, is_bf16_supported  # noqa: F401
from {{ cookiecutter.package }}.random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

_DEVICE = "{{ cookiecutter.device }}"


def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device) -> None:
    _C.set_device(_index(device))


class device:
    """Context manager that makes `device` the current {{ cookiecutter.device }} device."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C.exchange_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            _C.set_device(self.prev_idx)
        return False


def synchronize(device=None) -> None:
    _C.synchronize(_index(device))


def _is_in_bad_fork() -> bool:
    return _C.is_in_bad_fork()


def _lazy_init() -> None:
    if _C.is_in_bad_fork():
        raise RuntimeError(
            f"cannot use the {_DEVICE} device in a process forked after the parent used it; "
            "use the 'spawn' multiprocessing start method"
        )


def is_initialized() -> bool:
    """True: the runtime initialises when the library loads (torch.distributed's DeviceMesh asks)."""
    return not _C.is_in_bad_fork()


# --- streams and events, under the names torch.cuda uses (FSDP's `fully_shard` calls these) -----

def _this_device(device=None) -> torch.device:
    return torch.device(_DEVICE, _index(device) if device is not None else _C.current_device())


def Stream(device=None, priority: int = 0) -> torch.Stream:  # noqa: N802  (torch.cuda.Stream's name)
    return torch.Stream(device=_this_device(device), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
    return torch.Event(device=_this_device(), enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_this_device(device))


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


class stream:  # noqa: N801  (torch.cuda.stream's name)
    """Context manager that makes `stream` current on its device."""

    def __init__(self, stream):
        self.stream, self.prev = stream, None

    def __enter__(self):
        if self.stream is not None:
            self.prev = torch.accelerator.current_stream(self.stream.device)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.prev is not None:
            torch.accelerator.set_stream(self.prev)
        return False


# --- memory -----------------------------------------------------------------------------------

def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_stats(device=None) -> dict:
    return torch.accelerator.memory_stats(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    return tuple(_C.mem_info(_index(device)))


def set_memory_limit(nbytes: int, device=None) -> None:
    """Set the emulated device's capacity (also: {{ cookiecutter.DEVICE }}_MEMORY_LIMIT=16G)."""
    _C.set_memory_limit(_index(device), int(nbytes))


# --- the CPU fallback -------------------------------------------------------------------------

def fallback_counts() -> dict[str, int]:
    """How often each operator without a {{ cookiecutter.device }} kernel ran on the CPU, e.g. {"aten::sin.out": 3}."""
    return {name: calls for name, (calls, _) in _C.fallback_stats().items()}


def fallback_stats() -> dict[str, tuple[int, float]]:
    """Per operator that ran through the CPU fallback: (calls, seconds spent in the fallback)."""
    return dict(_C.fallback_stats())


def reset_fallback_counts() -> None:
    _C.reset_fallback_counts()


def set_fallback_warning(enabled: bool) -> None:
    """Warn (once per operator) when an operator falls back to the CPU ({{ cookiecutter.DEVICE }}_WARN_FALLBACK=1)."""
    _C.set_fallback_warning(bool(enabled))


# --- backend metadata carried through torch.save (see csrc/aten/serialization.cpp) ------------

def set_layout_tag(tensor: torch.Tensor, tagged: bool) -> None:
    torch.ops.{{ cookiecutter.package }}.set_layout_tag(tensor, bool(tagged))


def layout_tag(tensor: torch.Tensor) -> bool:
    return torch.ops.{{ cookiecutter.package }}.layout_tag(tensor)
