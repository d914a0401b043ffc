"""What every example shares: which device to run on, and how to fail.

The examples run on the PrivateUse1 backend that `import torch` loads (autoload through the
`torch.backends` entry point of the installed backend, e.g. `torch-mychip`); `--device NAME`
names it explicitly and fails if that is not the backend this process has.
"""

from __future__ import annotations

import argparse
import sys

import torch


def fail(message: str, code: int = 1) -> None:
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def loaded_backend() -> str | None:
    """The name of the PrivateUse1 backend in this process, or None when none is loaded."""
    name = torch._C._get_privateuse1_backend_name()
    return None if name == "privateuseone" else name


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--device", metavar="NAME", help="the backend's device name [default: the backend `import torch` loads]"
    )
    return p


def backend_device(requested: str | None) -> str:
    """The device the example runs on; exits with status 2 and a reason when there is none."""
    loaded = loaded_backend()
    if loaded is None:
        hint = (
            " (TORCH_DEVICE_BACKEND_AUTOLOAD=0 is set: unset it, or import the backend's package)"
            if __import__("os").environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0"
            else " (install a generated backend: backendgen new NAME, "
            "or pip install --no-build-isolation -e . in its project)"
        )
        fail(f"no PrivateUse1 backend is loaded in this process{hint}", 2)
    if requested is not None and requested != loaded:
        fail(
            f"--device {requested}: the backend loaded in this process is {loaded!r} "
            "(one PrivateUse1 backend per process)",
            2,
        )
    module = getattr(torch, loaded, None)
    if module is None or not module.is_available():
        fail(f"the {loaded} backend is loaded but reports no device", 2)
    return loaded
