"""The {{ cookiecutter.device }} collective backend's registration with torch.distributed.

Importing the package registers (`register()` below) the c10d backend "{{ cookiecutter.device }}ccl" for
{{ cookiecutter.device }} tensors — a C++ `c10d::Backend` (csrc/distributed/process_group.cpp), built the way
ProcessGroupNCCL/XCCL are — so, as with NCCL on CUDA:

- `dist.init_process_group()` with no backend named makes a c10d ProcessGroup whose {{ cookiecutter.device }}
  tensors go to "{{ cookiecutter.device }}ccl" and whose CPU tensors go to PyTorch's own gloo (torch 2.13 alone
  would give it the device's backend only: `_gloo_for_cpu_tensors` below);
  `backend="{{ cookiecutter.device }}ccl"` or `"cpu:gloo,{{ cookiecutter.device }}:{{ cookiecutter.device }}ccl"` name it;
- `pg._get_backend(torch.device("{{ cookiecutter.device }}"))` returns it, and
  `init_process_group(device_id=torch.device("{{ cookiecutter.device }}", rank))` binds it (FSDP2's eager init);
- `TORCH_DISTRIBUTED_DEBUG=DETAIL` wraps it in c10d's ProcessGroupWrapper, which checks every
  collective's fingerprint on every rank;
- a program that uses only CPU tensors gets plain gloo for them, whether or not this backend
  is installed; a group with the device's backend alone (`backend="{{ cookiecutter.device }}ccl"`, or
  `new_group(backend="{{ cookiecutter.device }}ccl")`) runs object collectives on the device, as NCCL's does.

The backend hands each collective on device tensors to a transport: here a gloo process group of
{% if cookiecutter.driver == "emulator" %}its own, given host views of the device memory (the emulated device's memory is host memory).
{%- else %}its own, given host copies of the device memory (the driver does not map device memory for the
host: process_group.cpp stages each tensor through driver::memcpy).{% endif %}
What a hardware team replaces: the transport calls in process_group.cpp, with its collective
library's; this file stays.
"""

from __future__ import annotations

import torch

DEVICE = "{{ cookiecutter.device }}"
BACKEND = "{{ cookiecutter.device }}ccl"  # the c10d backend's name: init_process_group(backend="{{ cookiecutter.device }}ccl")


def is_available() -> bool:
    return torch.distributed.is_available()


def _create(opts, backend_options=None):
    """The creator torch.distributed calls for each process group ("extended" API: `opts` is a
    `_DistributedBackendOptions`, its store already prefixed for this group and device)."""
    import torch.distributed as dist

    from {{ cookiecutter.package }} import _C

    # The transport: a gloo group of its own, beside the one c10d makes for CPU tensors (another
    # store prefix), so device and CPU collectives never share a sequence of messages.
    transport = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return _C.make_process_group_backend(transport, opts.group_rank, opts.group_size, opts.timeout.total_seconds())


def _gloo_for_cpu_tensors(c10d) -> None:
    """With no backend named, torch 2.13 gives the default group a backend for the accelerator's
    device type only — here "{{ cookiecutter.device }}ccl" — so a program that collects CPU tensors would fail
    ("No backend type associated with device type cpu") just because this backend is installed,
    and DDP, asking for the group's default backend (gloo, for any accelerator but CUDA), would
    find none. The default group gets PyTorch's own gloo for CPU tensors beside it, as
    `backend="cpu:gloo,{{ cookiecutter.device }}:{{ cookiecutter.device }}ccl"` would give."""
    base = c10d.BackendConfig
    if getattr(base, "_{{ cookiecutter.package }}_gloo_for_cpu", False):
        return

    class BackendConfig(base):
        _{{ cookiecutter.package }}_gloo_for_cpu = True

        def __init__(self, backend):
            super().__init__(backend)
            if str(backend) == c10d.Backend.UNDEFINED and dict(self.device_backend_map) == {DEVICE: BACKEND}:
                self.device_backend_map = {"cpu": c10d.Backend(c10d.Backend.GLOO), DEVICE: self.device_backend_map[DEVICE]}

    c10d.BackendConfig = BackendConfig


def register() -> None:
    """Make "{{ cookiecutter.device }}ccl" the c10d backend of {{ cookiecutter.device }} tensors (called when the package loads)."""
    if not is_available():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[DEVICE])
    _gloo_for_cpu_tensors(c10d)
