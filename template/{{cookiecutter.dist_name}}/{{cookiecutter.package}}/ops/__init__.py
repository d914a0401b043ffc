"""The {{ cookiecutter.device }} backend's own operators, by name: `from {{ cookiecutter.package }}.ops import NAME`.

`backendgen add-op {{ cookiecutter.device }}::NAME --schema "..."` defines an operator in C++
(csrc/custom_ops/NAME.cpp, `torch.ops.{{ cookiecutter.device }}.NAME`) and writes its documented Python
wrapper as a module of this package, `ops/NAME.py`, holding a function of the same name. This file
gathers those functions; it needs no edit when an operator is added.
"""

import importlib as _importlib
import pkgutil as _pkgutil

__all__ = []

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        globals()[_module.name] = getattr(_importlib.import_module(f"{__name__}.{_module.name}"), _module.name)
        __all__.append(_module.name)
