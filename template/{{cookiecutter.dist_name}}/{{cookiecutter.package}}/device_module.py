"""`torch.{{ cookiecutter.device }}`: the device module PyTorch looks up by the backend's name.

Devices (is_available, device_count, current_device, set_device, the `device` context manager,
synchronize, init/is_initialized/_lazy_init — PyTorch's lazy initialisation through the runtime's
hooks — properties), streams and events (`Stream`, `Event`, current_stream, stream(); FSDP's
`fully_shard` and DTensor use them), memory (statistics, reserved bytes, capacity), the CPU fallback's counters, and — re-exported from their own
modules — random number generation, autocast support, graphs (graphs.py) and ipc_collect (ipc.py). Everything PyTorch's own Python reads
from a device module is here (template.json "device_module" lists it; tests/test_device_module.py
checks each; `backendgen check` names one a newer torch starts reading): `_initialized`, the
flag activation checkpointing needs to save and restore the device's RNG state, and
`default_generators` are answered by `__getattr__` at the end. The names Inductor looks up on a PrivateUse1 device module (`Scheduling`, ...) come from
compiler/inductor.py, imported on first use. What a hardware team replaces: nothing — everything
here calls into the C++ runtime, and the device properties come from the driver
(driver::get_device_properties).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from {{ cookiecutter.package }} import _C, _utils  # noqa: F401  (_utils: serialization reads _utils._get_device_index)
from {{ cookiecutter.package }} import storages as _storages
from {{ cookiecutter.package }}._utils import device_index as _index
from {{ cookiecutter.package }}.amp import get_amp_supported_dtype, is_bf16_supported  # noqa: F401
from {{ cookiecutter.package }}.graphs import (  # noqa: F401
    Graph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from {{ cookiecutter.package }}.ipc import ipc_collect  # noqa: F401
from {{ cookiecutter.package }}.random import (  # noqa: F401
    _get_generator,
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

# the legacy typed storages (FloatStorage, ...): tensor.storage_type() answers them (storages.py)
globals().update(_storages.classes())


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


@dataclass(frozen=True)
class DeviceProperties:
    """What `torch.{{ cookiecutter.device }}.get_device_properties()` reports: the driver's
    get_device_properties (Inductor reads multi_processor_count)."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int


def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(*_C.device_properties(_index(device)))


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> str:
    """A code generator's target name for the device ("" here: no variants)."""
    _index(device)
    return ""


def is_initialized() -> bool:
    """Whether the device runtime was initialised in this process (the first tensor on the device,
    or `init()`, does it) — False in a child forked after the parent initialised it."""
    return _C.is_initialized() and not _C.is_in_bad_fork()


def init() -> None:
    """Initialise the device runtime now (PyTorch does it before the first tensor on the device)."""
    _lazy_init()


# --- streams and events (torch.Stream / torch.Event on this device; csrc/runtime/guard.cpp) ----

class Stream(torch.Stream):
    """A stream of the {{ cookiecutter.device }} device, as torch.cuda.Stream is CUDA's.

    `Stream(device=None, priority=0)` hands out a stream of the device's pool for that priority
    (lower values run first; torch.{{ cookiecutter.device }}.Stream.priority_range() gives the range, clamped like
    CUDA's). It is a torch.Stream, so torch.accelerator, `stream()` and FSDP accept it; it adds
    `priority` and makes `record_event` return an `Event` of this module.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # stream_id=, device_index=, device_type=: wraps an existing stream
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, device=torch.device(_DEVICE, _index(device)), priority=priority)

    def __init__(self, *args, **kwargs):  # everything happened in __new__
        pass

    @property
    def priority(self) -> int:
        return _C.stream_priority(self.device_index, self.stream_id)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority: the default, and the one that runs first."""
        return tuple(_C.stream_priority_range())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.{_DEVICE}.Stream device={_DEVICE}:{self.device_index} stream_id={self.stream_id} priority={self.priority}>"


class Event(torch.Event):
    """An event of the {{ cookiecutter.device }} device, as torch.cuda.Event is CUDA's:
    `Event(enable_timing=False)`; record(stream=None), wait(stream=None), query(), synchronize(),
    elapsed_time(end) (milliseconds; both events need enable_timing=True)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(
            cls, device=_DEVICE, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )

    def __init__(self, *args, **kwargs):  # everything happened in __new__
        pass

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to `end_event` (both recorded with enable_timing=True)."""
        return _C.event_elapsed_time(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.{_DEVICE}.Event device={self.device}>"


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


def current_stream(device=None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_index(device)))


def default_stream(device=None) -> Stream:
    current = torch.accelerator.current_stream(_index(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream: torch.Stream | None):
    """Make `stream` current on its device for the block (None: leave the current stream)."""
    if stream is None:
        yield
        return
    previous = current_stream(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(previous)


def _sleep(microseconds: int) -> None:
    """Queue work that keeps the current stream busy for `microseconds` (a test aid, like
    torch.cuda._sleep): what follows on the stream waits, the host does not. Needs the driver's
    "spin" capability."""
    _require("spin", "_sleep")
    _C.sleep(int(microseconds))


@contextlib.contextmanager
def _held_stream(timeout_s: float = 10.0):
    """Hold the current stream for the block (a test aid): work queued on it before or in the block
    waits until the block ends, or until `timeout_s` passed, whichever comes first (the device's
    other streams may wait too: the hold is host work on the stream); the host does not wait. A test
    looks at what is still pending for as long as it needs, with no fixed sleep. A call in the block
    that waits for the stream returns only after the timeout, and the block then raises
    AssertionError as it ends. Needs the driver's "host_tasks" capability."""
    _require("host_tasks", "_held_stream")
    token = _C.hold(int(timeout_s * 1_000_000))
    try:
        yield
    except BaseException:
        _C.release(token)
        raise
    if _C.release(token):
        raise AssertionError(
            f"the stream's hold timed out after {timeout_s} s: a call in the block waited for the stream"
        )


def capabilities() -> frozenset[str]:
    """The driver's optional capabilities (csrc/driver/driver.h): any of "host_mapping",
    "host_tasks", "spin", "memory_limit", "tracing", "graphs" and "ipc". A test aid or feature that needs one
    raises, or its test skips, naming it when the driver lacks it."""
    return frozenset(_C.capabilities())


def _require(capability: str, what: str) -> None:
    if capability not in capabilities():
        raise RuntimeError(
            f"{what} needs the {{ cookiecutter.device }} driver's '{capability}' capability (csrc/driver/driver.h), "
            "which this driver does not have"
        )


def _is_in_bad_fork() -> bool:
    """PyTorch's flag: this process was forked after the parent initialised the device."""
    return _C.is_in_bad_fork()


def _lazy_init() -> None:
    """PyTorch calls this before it creates a tensor on the device from Python: runs the runtime's
    one-time initialisation (the hooks' init(), csrc/runtime/hooks.cpp) through torch's lazy
    device initialisation, or refuses in a child forked after the parent initialised the device.
    Then it runs what `_lazy_call` deferred."""
    if _C.is_in_bad_fork():
        raise RuntimeError(
            f"Cannot re-initialize {_DEVICE} in forked subprocess. To use {_DEVICE} with "
            "multiprocessing, you must use the 'spawn' start method"
        )
    _C.lazy_init()
    _run_deferred()


_deferred_calls: list = []
_deferred_seed: dict = {}  # "seed" / "seed_all": only the latest seeding call matters, as on CUDA


def _lazy_call(callable, **kwargs) -> None:
    """Run `callable` once the device is initialised — now, if it is (torch.accelerator defers
    work, such as seeding, through this, as torch.cuda._lazy_call does; torch 2.14 and later)."""
    if is_initialized():
        callable()
        return
    if kwargs.get("seed_all") or kwargs.get("seed"):
        _deferred_seed["seed_all" if kwargs.get("seed_all") else "seed"] = callable
    else:
        _deferred_calls.append(callable)


def _run_deferred() -> None:
    calls = [*_deferred_seed.values(), *_deferred_calls]
    _deferred_seed.clear()
    _deferred_calls.clear()
    for call in calls:
        call()


# --- memory -----------------------------------------------------------------------------------

def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds from the driver (in use or cached)."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def memory_stats(device=None) -> dict:
    return torch.accelerator.memory_stats(_index(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of the caching allocator's statistics (what FSDP prints on an OOM), in the
    spirit of torch.cuda.memory_summary: current and peak bytes allocated and reserved, allocation
    counts, and the device's capacity."""
    index = _index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
        return str(n)

    rows = [("allocated bytes", "allocated_bytes.all"), ("reserved bytes", "reserved_bytes.all"),
            ("allocations", "allocation.all"), ("active bytes", "active_bytes.all")]
    lines = [f"{_DEVICE}:{index} memory summary", f"{'metric':<20}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
    for label, key in rows if not abbreviated else rows[:2]:
        values = [stats.get(f"{key}.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
        fmt = size if "bytes" in label else str
        lines.append(f"{label:<20}" + "".join(f"{fmt(v):>14}" for v in values))
    lines.append(f"device capacity: {size(total)}, free: {size(free)}")
    return "\n".join(lines)


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Release the cached blocks no tensor uses, and first the storages sent to other processes that
    no receiver holds any more (ipc.py)."""
    ipc_collect()
    torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    return tuple(_C.mem_info(_index(device)))


def set_memory_limit(nbytes: int, device=None) -> None:
    """Set the device's capacity (also: {{ cookiecutter.DEVICE }}_MEMORY_LIMIT=16G). Needs the driver's
    "memory_limit" capability."""
    index = _index(device)
    _require("memory_limit", "set_memory_limit")
    _C.set_memory_limit(index, int(nbytes))


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


# --- torch.compile (compiler/) ------------------------------------------------------------------

def _inductor_backend_init() -> None:
    """Inductor's hook for a PrivateUse1 backend (torch 2.15 and later call it when they set up
    their backends): importing compiler/inductor.py registers the code generator."""
    from {{ cookiecutter.package }}.compiler import inductor  # noqa: F401


def _call_staged(kernel, args) -> None:
    """What torch.compile's wrapper calls for a fused kernel when the driver has no host_mapping."""
    from {{ cookiecutter.package }}.compiler.inductor import call_staged

    call_staged(kernel, args)


def __getattr__(name: str):
    """Attributes whose value changes, as torch.cuda's do: `_initialized` (True once the device is
    initialised in this process, False before and in a child forked after the parent initialised
    it; torch.utils.checkpoint restores the device's RNG state for recomputation only when it is
    True) and `default_generators` (one torch.Generator per device; graph-safe RNG reads it).
    Inductor also asks a PrivateUse1 device module for its code generator by the names in
    compiler.INDUCTOR_HOOKS (torch 2.13 and 2.14; later ones call `_inductor_backend_init` above
    and fall back to these)."""
    if name == "_initialized":
        return is_initialized()
    if name == "default_generators":
        return tuple(_C.default_generator(i) for i in range(_C.device_count()))
    from {{ cookiecutter.package }} import compiler

    if name in compiler.INDUCTOR_HOOKS:
        return compiler.inductor_hook(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
