"""Random number generation on {{ cookiecutter.device }}: seeding and generator state per device.

`torch.manual_seed` seeds these too (it calls `manual_seed_all` of the device module). The
generators live in C++ (csrc/runtime/generator.cpp); these functions reach them through
`_C.default_generator(index)`, a regular `torch.Generator`.

A generator is counter-based, as CUDA's: its state is a seed and an offset, and each random kernel
takes the next offset when the host launches it, so what a kernel draws is fixed by the order of
the host's calls even while earlier kernels are still queued. `get_rng_state` returns that state as
16 bytes (torch.uint8): the seed, then the offset, each a little-endian uint64 (CUDA's layout);
`set_rng_state` takes it back, and torch.utils.checkpoint's recompute draws the same numbers.
"""

from __future__ import annotations

import torch

from {{ cookiecutter.package }} import _C
from {{ cookiecutter.package }}._utils import device_index as _index


def default_generator(device=None) -> torch.Generator:
    return _C.default_generator(_index(device))


def _get_generator(device: torch.device) -> torch.Generator:
    """The default generator of `device` (its index, or the current device): AOTAutograd's
    graph-safe RNG asks the device module for it by this name, as torch.cuda._get_generator."""
    index = device.index if isinstance(device, torch.device) else None
    return default_generator(_C.current_device() if index is None else index)


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(_C.device_count()):
        _C.default_generator(i).manual_seed(int(seed))


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    s = default_generator(0).seed()
    manual_seed_all(s)


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="{{ cookiecutter.device }}") -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="{{ cookiecutter.device }}") -> None:
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [_C.default_generator(i).get_state() for i in range(_C.device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        _C.default_generator(i).set_state(state)
