"""Shared fixtures of the {{ cookiecutter.device }} backend's tests."""

import subprocess
import sys
import warnings

import pytest
import torch

import {{ cookiecutter.package }}  # noqa: F401  (works with TORCH_DEVICE_BACKEND_AUTOLOAD=0 too)

DEVICE = "{{ cookiecutter.device }}"


# The driver's optional capabilities (csrc/driver/driver.h: host_mapping, host_tasks, spin,
# memory_limit, tracing). A test that needs one is marked with requires(...) and skips, naming it,
# on a driver without it (the minimal driver has none); nothing else depends on them.
CAPABILITIES = getattr(torch, DEVICE).capabilities()


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Skips the test (a module: `pytestmark = requires(...)`) unless the driver has every one of
    `capabilities`; the reason names those it lacks."""
    missing = [c for c in capabilities if c not in CAPABILITIES]
    names = " and ".join(f"'{c}'" for c in missing)
    return pytest.mark.skipif(
        bool(missing),
        reason=f"the {DEVICE} driver lacks the {names} capabilit{'y' if len(missing) == 1 else 'ies'} (driver.h)",
    )


# Kernels queued on a stream, the host returning before they run: the template's kernels are host
# code (aten/kernel_support.cpp), queued with host_tasks on host-mapped memory; otherwise each runs
# on the calling thread, staged, before the call returns.
queued_kernels = requires("host_tasks", "host_mapping")

# Copies within the device and non_blocking ones queued on a stream: the driver's memcpy_async
# queues them on a driver without host_mapping; with host_mapping they are host code (the CPU copy
# on host views), queued only with host_tasks.
queued_copies = pytest.mark.skipif(
    "host_mapping" in CAPABILITIES and "host_tasks" not in CAPABILITIES,
    reason=f"the {DEVICE} driver has 'host_mapping' but lacks the 'host_tasks' capability (driver.h): "
    "its copies are host code, run before the call returns",
)


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
