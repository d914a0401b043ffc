"""Small helpers shared by the package's modules."""

from __future__ import annotations

import torch

from {{ cookiecutter.package }} import _C


def device_index(device=None) -> int:
    """The index of a {{ cookiecutter.device }} device given as None (current), an int, a string or a torch.device."""
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "{{ cookiecutter.device }}":
        raise ValueError(f"expected a {{ cookiecutter.device }} device, got {device}")
    return _C.current_device() if device.index is None else device.index
