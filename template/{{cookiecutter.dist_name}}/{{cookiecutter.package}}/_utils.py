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


def _get_device_index(device, optional: bool = False, allow_cpu: bool = False) -> int:
    """torch.cuda._utils._get_device_index for this device (torch.load with map_location reads it
    from the device module): the index of a torch.device, str or int; None or an index-less
    device gives the current device if `optional`; a CPU device gives -1 if `allow_cpu`."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type == "cpu":
            if allow_cpu:
                return -1
            raise ValueError(f"expected a {{ cookiecutter.device }} device, but got: {device}")
        if device.type != "{{ cookiecutter.device }}":
            raise ValueError(f"expected a {{ cookiecutter.device }} device, but got: {device}")
        index = device.index
    else:
        index = device
    if index is None:
        if not optional:
            raise ValueError(f"expected a {{ cookiecutter.device }} device with a specified index or an integer, but got: {device}")
        return _C.current_device()
    return int(index)
