"""The {{ cookiecutter.device }} collective backend's registration with torch.distributed.

Importing the package registers (`register()` below) the c10d backend "{{ cookiecutter.device }}ccl" for
{{ cookiecutter.device }} tensors — a C++ `c10d::Backend` (csrc/distributed/process_group.cpp), built the way
ProcessGroupNCCL/XCCL are — so, as with NCCL on CUDA:

- `dist.init_process_group()` with no backend named makes a c10d ProcessGroup whose CPU tensors go
  to PyTorch's own gloo and whose {{ cookiecutter.device }} tensors go to "{{ cookiecutter.device }}ccl";
  `backend="{{ cookiecutter.device }}ccl"` or `"cpu:gloo,{{ cookiecutter.device }}:{{ cookiecutter.device }}ccl"` name it;
- `pg._get_backend(torch.device("{{ cookiecutter.device }}"))` returns it, and
  `init_process_group(device_id=torch.device("{{ cookiecutter.device }}", rank))` binds it (FSDP2's eager init);
- `TORCH_DISTRIBUTED_DEBUG=DETAIL` wraps it in c10d's ProcessGroupWrapper, which checks every
  collective's fingerprint on every rank;
- a program that uses only CPU tensors gets plain gloo for them, whether or not this backend
  is installed.

The backend hands each collective on device tensors to a transport: here a gloo process group of
its own, given host views of the device memory (the emulated device's memory is host memory).
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


def register() -> None:
    """Make "{{ cookiecutter.device }}ccl" the c10d backend of {{ cookiecutter.device }} tensors (called when the package loads)."""
    if not is_available():
        return
    import torch.distributed as dist

    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[DEVICE])
