"""Refuses to load _C beside another torch than the one it was compiled against, saying what to do.

PyTorch keeps no C++ ABI between releases: an extension built for torch 2.13 fails in another torch
with an undefined symbol, or worse. setup.py writes `_build_info.py` (the torch it compiled against)
beside _C; `check()` compares it with the torch imported now, before `__init__.py` loads _C, and the
error names both versions and the way out — for a wheel (install the wheel built for this torch, or
this wheel's torch) and for a source checkout (rebuild). A local label (+cpu, +cu130) is ignored:
CPU and CUDA builds of one release share the ABI this backend links against.

A hardware team replaces nothing here.
"""

from pathlib import Path

import torch

PACKAGE = "{{ cookiecutter.package }}"
DIST = "{{ cookiecutter.dist_name }}"


class TorchMismatch(ImportError):
    """The backend was built for another torch. Its message is complete: what autoload shows as is."""

    self_explanatory = True


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def built_for() -> str | None:
    """The torch version _C was compiled against (None: built before this was recorded)."""
    try:
        from {{ cookiecutter.package }}._build_info import TORCH_VERSION
    except ImportError:
        return None
    return TORCH_VERSION


def check() -> None:
    built = built_for()
    if built is None or _release(built) == _release(torch.__version__):
        return
    want, have = _release(built), _release(torch.__version__)
    source_checkout = (Path(__file__).resolve().parent.parent / "setup.py").is_file()
    if source_checkout:
        todo = ("in this source checkout, rebuild it against the installed torch "
                "(pip install --no-build-isolation -e . , or backendgen build)")
    else:
        todo = (f"install the {DIST} wheel built for torch {have}, "
                f"or the torch this one was built for: pip install torch=={want}")
    raise TorchMismatch(f"{PACKAGE} was built for torch {want} but torch {have} is installed; "
                        f"a backend loads only beside the torch it was built for: {todo}")
