"""Autocast support on {{ cookiecutter.device }}: the dtypes `torch.autocast("{{ cookiecutter.device }}", dtype=...)` accepts.

The per-op policy (which ops run in the lower precision, which in float32) is in
csrc/aten/autocast.cpp. What a hardware team replaces: the list below, with what it computes in.
"""

from __future__ import annotations

import torch


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported() -> bool:
    return True
