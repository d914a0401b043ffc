"""Shared fixtures of the {{ cookiecutter.device }} backend's tests."""

import subprocess
import sys

import pytest
import torch

import {{ cookiecutter.package }}  # noqa: F401  (works with TORCH_DEVICE_BACKEND_AUTOLOAD=0 too)

DEVICE = "{{ cookiecutter.device }}"


@pytest.fixture
def mod():
    """torch.{{ cookiecutter.device }}"""
    return getattr(torch, DEVICE)


def run_python(code: str, env=None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (for exit behaviour, autoload, fork and aborts)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
