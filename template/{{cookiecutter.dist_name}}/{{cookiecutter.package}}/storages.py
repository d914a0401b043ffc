"""The legacy typed storage classes of `torch.{{ cookiecutter.device }}` (FloatStorage, LongStorage, ...), as
torch.cuda defines them for CUDA.

PyTorch still answers `tensor.storage_type()` and `isinstance(storage, torch.<device>.FloatStorage)`
with them: torch/storage.py looks the class up in the device's module by the dtype's storage name
and recognises the device from the class's module name, which must end in the device's name (hence
`__module__` below). Deprecated in PyTorch in favour of `untyped_storage()`, but PyTorch's own tests
and older code still use them. What a hardware team replaces: nothing.
"""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

_MODULE = "torch.{{ cookiecutter.device }}"


class _DeviceLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for {{ cookiecutter.device }} storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for {{ cookiecutter.device }} storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for {{ cookiecutter.device }} storage")


_DeviceLegacyStorage.__module__ = _MODULE


def _storage_class(name: str, dtype: torch.dtype) -> type:
    def _dtype(cls):
        return dtype

    def public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(name, (_DeviceLegacyStorage,), {"_dtype": classproperty(_dtype), "dtype": classproperty(public_dtype)})
    cls.__module__ = _MODULE
    cls.__qualname__ = name
    return cls


def classes() -> dict[str, type]:
    """One class per dtype PyTorch names a legacy storage for: {"FloatStorage": ..., ...}."""
    return {name: _storage_class(name, dtype) for dtype, name in torch.storage._dtype_to_storage_type_map().items()}
