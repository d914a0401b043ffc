"""torch.compile on {{ cookiecutter.device }}: how Dynamo and Inductor learn about the device.

Two registrations, both made only when PyTorch's compiler is first imported, so `import torch`
pays nothing for them:

- `dynamo.py`: Dynamo's device interface (current device, streams, events, synchronize, device
  properties), registered right after `torch._dynamo.device_interface` is imported, before Dynamo
  builds its tables of stream functions from the registered interfaces.
- `inductor.py`: Inductor's code generator for the device. When Inductor first sets up its
  backends it calls the device module's `_inductor_backend_init` (torch 2.15 and later) or asks it
  for `torch.{{ cookiecutter.device }}.Scheduling` and the wrapper classes (2.13, 2.14); either way the device
  module imports `inductor.py`, which registers everything Inductor needs.

What a hardware team replaces: `Scheduling` in `inductor.py` (the code generator). The rest follows
the runtime (`device_module.py`) and stays.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

# What Inductor looks up on the device module of a PrivateUse1 backend
# (torch._inductor.codegen.common.init_backend_registration), each answered from inductor.py.
INDUCTOR_HOOKS = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")

_DYNAMO_MODULE = "torch._dynamo.device_interface"


def inductor_hook(name: str):
    """The object Inductor asks `torch.{{ cookiecutter.device }}` for (importing inductor.py registers the device)."""
    from {{ cookiecutter.package }}.compiler import inductor

    return getattr(inductor, name)


def install() -> None:
    """Register the device with Dynamo now if Dynamo is already imported, else as soon as it is;
    and with Inductor now if Inductor has already set up its backends (a backend loaded late)."""
    _after_import(_DYNAMO_MODULE, _register_dynamo)
    if "torch._inductor.codegen.common" in sys.modules:
        from {{ cookiecutter.package }}.compiler import inductor  # noqa: F401  (registers on import)


def _register_dynamo() -> None:
    from {{ cookiecutter.package }}.compiler import dynamo

    dynamo.register()


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets the other finders find one module and runs `callback` once that module has executed."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback, self._loader = name, callback, None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                self._loader, spec.loader = spec.loader, self
                return spec
        return None

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        _run_reported(self.callback)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        if self._loader is None:
            raise AttributeError(name)
        return getattr(self._loader, name)


def _run_reported(callback) -> None:
    """A registration that fails must not break Dynamo for other devices: warn instead."""
    try:
        callback()
    except Exception as e:
        warnings.warn(f"torch.compile is unavailable on {{ cookiecutter.device }}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


def _after_import(name: str, callback) -> None:
    if name in sys.modules:
        _run_reported(callback)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
