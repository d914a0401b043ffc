"""The {{ cookiecutter.device }} backend for PyTorch.

Importing this package loads the C++ runtime (allocators, device guard, hooks, kernels, CPU
fallback — all registered when the library loads), names the PrivateUse1 backend
"{{ cookiecutter.device }}", registers `torch.{{ cookiecutter.device }}` and generates the tensor, module and storage methods
(`tensor.{{ cookiecutter.device }}()`, `.is_{{ cookiecutter.device }}`, `module.{{ cookiecutter.device }}()`), registers the collective backend
"{{ cookiecutter.device }}ccl" for torch.distributed (distributed.py), lets torch.multiprocessing share device
tensors between processes (ipc.py), and makes the device known to
torch.compile once Dynamo or Inductor is imported (compiler/). Plain `import torch` does all
of this through the `torch.backends` entry point ({{ cookiecutter.package }}_autoload.py).
"""

import sys

import torch

DEVICE = "{{ cookiecutter.device }}"


def _check_private_use1_is_free() -> None:
    """PrivateUse1 holds one backend per process, and a second library registering its kernels
    there aborts the process while it loads. Refuse before loading ours, with a reason."""
    taken = torch._C._get_privateuse1_backend_name()
    ours_loaded = f"{__name__}._C" in sys.modules  # an earlier, failed import of this package
    registered = torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "PrivateUse1")
    if taken == "privateuseone" and registered and not ours_loaded:
        taken = "an unnamed backend"
    if taken not in ("privateuseone", DEVICE):
        raise ImportError(
            f"cannot load {{ cookiecutter.package }}: PrivateUse1 already belongs to {taken!r} in this process "
            "(one PrivateUse1 backend per process; uninstall the other one or turn its autoload off)"
        )


_check_private_use1_is_free()

from {{ cookiecutter.package }} import _torch_match  # noqa: E402

_torch_match.check()  # built for this torch? (else the error says what to do, before _C fails to load)

from {{ cookiecutter.package }} import _C  # noqa: E402, F401  (loads and registers the C++ runtime)
from {{ cookiecutter.package }} import _exit  # noqa: E402
from {{ cookiecutter.package }} import compiler as _compiler  # noqa: E402
from {{ cookiecutter.package }} import device_module as _device_module  # noqa: E402
from {{ cookiecutter.package }} import distributed as _distributed  # noqa: E402
from {{ cookiecutter.package }} import ipc as _ipc  # noqa: E402


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != DEVICE:
        torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )


_register()
_distributed.register()  # the c10d backend for torch.distributed (distributed.py)
_ipc.register()  # device tensors through torch.multiprocessing (ipc.py)
_compiler.install()
_exit.install()
