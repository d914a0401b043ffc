"""The environment of the Python subprocesses backendgen starts, and the installed torch, found
without importing it (importing torch costs seconds, and a backend being built must not load)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def subprocess_env(*, autoload: str | None = "0", pythonpath: Path | None = None) -> dict[str, str]:
    """A copy of this process's environment for a child Python. `autoload` is the value of
    TORCH_DEVICE_BACKEND_AUTOLOAD: "0" (the default) keeps `import torch` from loading an installed
    backend (it may be stale, being built, or crash when loaded), "1" loads it as for a user, None
    removes the variable (torch's default: on). `pythonpath` goes first on the child's PYTHONPATH."""
    env = dict(os.environ)
    if autoload is None:
        env.pop(AUTOLOAD, None)
    else:
        env[AUTOLOAD] = autoload
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@dataclass(frozen=True)
class InstalledTorch:
    version: str | None  # None: torch has no package metadata
    torch_dir: Path | None  # None: torch is not importable
    torchgen_dir: Path | None  # None: no torchgen package


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except ValueError:
        return None
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def installed_torch() -> InstalledTorch:
    """Where this Python's torch and torchgen are, and torch's version, without importing either."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return InstalledTorch(version, _package_dir("torch"), _package_dir("torchgen"))
