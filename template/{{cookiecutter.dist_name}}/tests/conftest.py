"""Shared fixtures of the {{ cookiecutter.device }} backend's tests."""

import subprocess
import sys
import warnings

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


@pytest.fixture
def drained(mod):
    """Waits for the device's queued work after the test, so none of it runs into the next one."""
    yield
    mod.synchronize()


def fallback_warnings(mod, fn) -> list[str]:
    """The messages of the warnings `fn()` raises with the CPU fallback's warning on (counters reset
    first: it warns once per operator)."""
    mod.reset_fallback_counts()
    mod.set_fallback_warning(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        mod.set_fallback_warning(False)
    return [str(w.message) for w in caught]
