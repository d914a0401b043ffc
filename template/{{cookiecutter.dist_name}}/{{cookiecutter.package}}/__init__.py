"""The {{ cookiecutter.device }} backend for PyTorch.

Importing this package loads the C++ runtime (allocators, device guard, hooks, kernels, CPU
fallback — all registered when the library loads), names the PrivateUse1 backend
"{{ cookiecutter.device }}", registers `torch.{{ cookiecutter.device }}` and generates the tensor, module and storage methods
(`tensor.{{ cookiecutter.device }}()`, `.is_{{ cookiecutter.device }}`, `module.{{ cookiecutter.device }}()`). Plain `import torch` does all
of this through the `torch.backends` entry point ({{ cookiecutter.package }}_autoload.py).
"""

import torch

from {{ cookiecutter.package }} import _C  # noqa: F401  (loads and registers the C++ runtime)
from {{ cookiecutter.package }} import _exit
from {{ cookiecutter.package }} import device_module as _device_module

DEVICE = "{{ cookiecutter.device }}"


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != DEVICE:
        torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )


_register()
_exit.install()
