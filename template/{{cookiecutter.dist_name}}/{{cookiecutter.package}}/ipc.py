"""{{ cookiecutter.device }} tensors shared between processes: torch.multiprocessing sends them as it
sends CUDA tensors, as a handle of their memory and not a copy (csrc/aten/ipc.cpp, over the driver's
optional capability `ipc`).

A tensor (or a Parameter, or an untyped storage) on the device that goes through a
`torch.multiprocessing` Queue, Pipe or a Process's arguments, or a DataLoader worker's results, is
pickled as: the driver's handle of the allocation holding its storage, the storage's offset and
size in it, and a slot of a counter in shared memory. The receiver maps the same memory: its
in-place writes are the sender's, and the other way round. Ordering: the sender waits for the
device's queued work before it exports (the receiver sees everything queued before the send); a
process that writes a shared tensor synchronizes before it tells another to read it, as on CUDA.

Lifetime, as CUDA's reference count per shared block: the sender counts one receiver per send
and keeps the storage (so its caching allocator does not give the block to another tensor) until
the receiver's storage dies, which takes it off. `ipc_collect()` (run by every send and by
`torch.{{ cookiecutter.device }}.empty_cache()`) lets go of the storages no receiver holds any more. A
received storage stays valid after the sender exits; the sender must live until the receiver has
unpickled the tensor (its file descriptor is fetched from the sender), as CUDA asks.

PyTorch hard-codes CUDA in torch/multiprocessing/reductions.py, so this module registers its own
reductions for torch.Tensor, Parameter and UntypedStorage with the ForkingPickler (after torch's,
which `import torch` installs) and hands every other tensor to torch's. `share_memory_()` is a
no-op for device tensors, as for CUDA's: their memory is shareable already. With a driver that lacks
`ipc`, sending a device tensor raises a RuntimeError that names the capability: in the sender (a
Process's arguments, a Pipe, a Pool's tasks), or, for a Queue, in the receiver as it unpickles the
message (a Queue pickles in its feeder thread, whose errors are only printed: the error travels with
the message instead of leaving the receiver waiting). What a hardware team replaces: nothing here.
"""

from __future__ import annotations

import os
import threading
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _mp_reduction

import torch
from torch.multiprocessing import reductions as _torch_reductions

from {{ cookiecutter.package }} import _C

DEVICE = "{{ cookiecutter.device }}"
_SLOTS = 1024  # counters per shared-memory block
_UNSUPPORTED = (
    "a {{ cookiecutter.device }} tensor was sent to another process, but sharing {{ cookiecutter.device }} memory between processes "
    "needs driver.h's optional capability 'ipc', which this driver lacks: send tensor.cpu() instead"
)

_lock = threading.Lock()
_free_slots: list[tuple[torch.Tensor, int]] = []
_sent: list[tuple[torch.UntypedStorage, torch.Tensor, int, int | None]] = []  # (storage, counters, slot, fd)


def _ops():
    return torch.ops.{{ cookiecutter.package }}


def is_supported() -> bool:
    """Whether the driver can share device memory with other processes (driver.h's `ipc`)."""
    return "ipc" in _C.capabilities()


def ipc_collect() -> int:
    """Let go of the storages sent to other processes that no receiver holds any more, as
    `torch.cuda.ipc_collect`; returns how many sent storages are still held."""
    with _lock:
        return _collect_locked()


def _collect_locked() -> int:
    kept = []
    for sent in _sent:
        _, counters, slot, fd = sent
        if _ops().ipc_counter(counters, slot, 0) > 0:
            kept.append(sent)
        else:
            _free_slots.append((counters, slot))
            if fd is not None:
                os.close(fd)
    _sent[:] = kept
    return len(kept)


def _take_slot() -> tuple[torch.Tensor, int]:
    if not _free_slots:
        counters = torch.zeros(_SLOTS, dtype=torch.int64).share_memory_()
        _free_slots.extend((counters, i) for i in reversed(range(_SLOTS)))
    return _free_slots.pop()


def _share(storage: torch.UntypedStorage) -> tuple:
    """What a receiver needs to map `storage`: its handle, where it is, one count of the sender's."""
    if storage.nbytes() == 0:
        return (storage.device.index, None)
    as_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    handle, fd, offset, nbytes = _ops().ipc_export(as_bytes)
    # The driver's descriptor, sent as multiprocessing sends one. A process being started passes
    # the descriptors of its arguments as they are and refuses one twice (two parameters in one
    # allocation): those get a copy of their own, open until the receiver lets go.
    own = os.dup(fd) if fd >= 0 and _mp_context.get_spawning_popen() is not None else None
    with _lock:
        _collect_locked()
        counters, slot = _take_slot()
        _ops().ipc_counter(counters, slot, 1)  # the receiver's, taken off when its storage dies
        _sent.append((storage, counters, slot, own))
    sent_fd = _mp_reduction.DupFd(own if own is not None else fd) if fd >= 0 else None
    return (storage.device.index, (handle, sent_fd, offset, nbytes, counters, slot))


def _open(device: int, shared) -> torch.UntypedStorage:
    if shared is None:
        return torch.UntypedStorage(0, device=torch.device(DEVICE, device))
    handle, dup_fd, offset, nbytes, counters, slot = shared
    fd = dup_fd.detach() if dup_fd is not None else -1
    return _ops().ipc_open(handle, fd, device, offset, nbytes, counters, slot).untyped_storage()


def _refuse(message: str):
    raise RuntimeError(message)


def _refusal() -> tuple:
    """A driver without ipc: raise where the sender sees it, or make the receiver raise."""
    if threading.current_thread().name == "QueueFeederThread":  # multiprocessing.Queue's: errors only printed
        return (_refuse, (_UNSUPPORTED,))
    raise RuntimeError(_UNSUPPORTED)


def _rebuild_tensor(cls, device, shared, dtype, size, stride, offset, requires_grad):
    storage = _open(device, shared)
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    t.requires_grad_(requires_grad)
    return t if cls is torch.Tensor else t.as_subclass(cls)


def _reduce_tensor(tensor: torch.Tensor):
    if (
        tensor.device.type != DEVICE
        or tensor.is_nested  # torch's reductions split these into dense device tensors, sent here
        or tensor.layout != torch.strided
        or (tensor.requires_grad and not tensor.is_leaf)  # torch's refusal
    ):
        return _torch_reductions.reduce_tensor(tensor)
    if not is_supported():
        return _refusal()
    torch.utils.hooks.warn_if_has_hooks(tensor)
    device, shared = _share(tensor.untyped_storage())
    meta = (tensor.dtype, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(), tensor.requires_grad)
    return (_rebuild_tensor, (type(tensor), device, shared, *meta))


def _reduce_storage(storage: torch.UntypedStorage):
    if storage.device.type != DEVICE:
        return _torch_reductions.reduce_storage(storage)
    if not is_supported():
        return _refusal()
    return (_open, _share(storage))


def register() -> None:
    """Install the reductions (after torch's: `import torch` has installed those)."""
    for cls in (torch.Tensor, torch.nn.Parameter):
        _mp_reduction.ForkingPickler.register(cls, _reduce_tensor)
    _mp_reduction.ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
