"""Inductor's code generator for {{ cookiecutter.device }}: what `torch.compile(model)` compiles fused kernels with.

Inductor lowers a captured graph to loops, fuses them, and hands each fused group to the code
generator ("scheduling") registered for the tensors' device; a wrapper (Python) allocates buffers
and calls the kernels in order, and the device op overrides are the runtime calls the wrapper
writes (set the device, synchronize, a device guard).

Here Inductor's own C++ code generator (`CppScheduling`, the CPU's) compiles the fused loops and
they run on the host: straight on device memory where the driver maps it for the host (driver.h's
host_mapping capability), else on host copies staged around each kernel call (`call_staged`).

What a hardware team replaces: `Scheduling` below — with `TritonScheduling` if the chip has a
Triton backend (Dynamo's interface in dynamo.py then returns real streams from `get_raw_stream`),
or with a scheduling class of its own that emits the chip's kernels. `_OnThisDevice` (what the
wrapper writes for this device) and the three loop-fusion settings in `_configure()` exist only
for the CPU code generator and go with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from pathlib import Path
from textwrap import dedent

import torch
import torch._inductor.config as inductor_config
from torch._inductor.codegen.common import DeviceOpOverrides, register_backend_for_device, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu as _CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapper
from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen as _SubgraphWrapper
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.virtualized import V

DEVICE = "{{ cookiecutter.device }}"


class HostCppScheduling(CppScheduling):
    """Inductor's C++ code generator (the CPU's), writing kernels that run on the host (see the module docstring).

    While it writes code, Inductor asks `get_current_backend()` which code generator that code is
    for, by device type; for any device but the CPU, XPU, MPS and TPU it answers
    `config.cuda_backend` ("triton"), and the C++ generator then takes Triton's branches (bf16
    `masked` loads lose their dtype). Inside this class's code generation the answer is "cpp".
    """

    def codegen_node(self, node):
        with _cpp_is_the_code_generator():
            return super().codegen_node(node)

    def codegen_template(self, *args, **kwargs):
        with _cpp_is_the_code_generator():
            return super().codegen_template(*args, **kwargs)


def _cpp_is_the_code_generator():
    if not hasattr(inductor_config, "cuda_backend"):  # a torch that no longer asks the setting
        return contextlib.nullcontext()
    return inductor_config.patch(cuda_backend="cpp")


# The code generator for the device's fused kernels (see the module's docstring).
Scheduling = HostCppScheduling


class _OnThisDevice:
    """What PyTorch's Python wrapper writes differently for this device:
    - a call for a kernel of the C++ generator, as for the CPU (the wrapper knows non-Triton
      kernels only on CUDA, XPU, MPS and the CPU), but with host views of the device tensors: the
      host cannot touch device memory (csrc/driver/driver.cpp), and the views wait for the
      current stream first (csrc/distributed/host_memory.cpp);
    - buffers allocated on the device they belong to: the wrapper names only the device type for a
      device it does not know (the current device then decides), and enters device guards only for
      GPU types, so a graph on `{{ cookiecutter.device }}:1` would get its buffers on `{{ cookiecutter.device }}:0`.
    """

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        if device.type != DEVICE or inductor_config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        allocation_shape = shape if allocation_shape is None else allocation_shape
        shape_tuple, stride_tuple = self.codegen_python_shape_tuple(shape), self.codegen_python_shape_tuple(stride)
        allocation_tuple = self.codegen_python_shape_tuple(allocation_shape)
        line = f"{name} = empty_strided({allocation_tuple}, {stride_tuple}, device='{device}', dtype={dtype})"
        if allocation_tuple != shape_tuple:
            line += f".as_strided({shape_tuple}, {stride_tuple})"
        return line

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if not triton and device.type == DEVICE:
            self.writeline(_call_on_host(kernel_name, call_args))
            return None
        return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


def _call_on_host(kernel_name: str, call_args) -> str:
    """The wrapper's line that runs a C++ kernel on host views of its device tensor arguments (or,
    without the driver's host_mapping, on staged host copies: `call_staged`)."""
    if not call_args:
        return f"{kernel_name}()"
    if "host_mapping" not in torch.{{ cookiecutter.device }}.capabilities():
        return f"torch.{{ cookiecutter.device }}._call_staged({kernel_name}, ({', '.join(call_args)},))"
    view = "torch.ops.{{ cookiecutter.package }}.host_view"
    args = ", ".join(call_args)
    return (
        f"{kernel_name}(*[{view}(a) if isinstance(a, torch.Tensor) and a.device.type == '{DEVICE}' else a "
        f"for a in ({args},)])"
    )


class PythonWrapperCodegen(_OnThisDevice, _PythonWrapper):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return _SubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return PythonWrapperCodegen()


class _SubgraphWrapperCodegen(_OnThisDevice, _SubgraphWrapper):
    pass


class CppWrapperCodegen(_CppWrapperCpu):
    """`torch._inductor.config.cpp_wrapper = True` (and AOTInductor): not supported on this device."""

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            f"Inductor's C++ wrapper (cpp_wrapper, AOTInductor) is not supported on {DEVICE}; "
            "use the default Python wrapper"
        )


WrapperFxCodegen = None  # Inductor's FX wrapper: not offered for this device


class {{ cookiecutter.device | capitalize }}DeviceOpOverrides(DeviceOpOverrides):
    """The runtime calls Inductor's Python wrapper writes for this device."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(f"""
            def {name}(index):
                return torch.{DEVICE}.current_stream(index).native_handle
            """)

    def set_device(self, device_idx: int) -> str:
        return f"torch.{DEVICE}.set_device({device_idx})"

    def synchronize(self) -> str:
        return f"torch.{DEVICE}.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.{DEVICE}.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class _CodeGeneratorVersion(CustomGraphModulePass):
    """Inductor caches compiled graphs on disk, keyed by the graph, its settings and the custom
    passes' uuids, not by the code generator's source. This pass changes nothing; its uuid is the
    hash of compiler/'s files, so after an edit here no kernel an older version wrote is reused."""

    def __call__(self, gm) -> None:
        pass

    def uuid(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(path.read_bytes())
        return digest.hexdigest()


def _configure() -> None:
    # PyTorch turns loop reordering and reindexing across fusions off for the CPU's code generator
    # (torch/_inductor/scheduler.py: "CPU reindexing is not validated yet", keyed on device "cpu");
    # the same generator runs here under this device's name, so turn them off for it too. These
    # settings are global: a CUDA device in the same process compiles without them.
    if issubclass(Scheduling, CppScheduling):
        for name in ("loop_ordering_after_fusion", "loop_reindexing_after_fusion", "loop_index_inversion_in_fusion"):
            if hasattr(inductor_config, name):
                setattr(inductor_config, name, False)


def register() -> None:
    register_device_op_overrides(DEVICE, {{ cookiecutter.device | capitalize }}DeviceOpOverrides())
    extra = {}
    if "device_custom_pass" in inspect.signature(register_backend_for_device).parameters:
        extra["device_custom_pass"] = _CodeGeneratorVersion()
    register_backend_for_device(DEVICE, Scheduling, PythonWrapperCodegen, CppWrapperCodegen, **extra)
    _configure()


register()


def call_staged(kernel, args) -> None:
    """Runs a compiled C++ kernel on host copies of its device tensor arguments, for a driver without
    host_mapping: each device storage an argument uses is copied to the host once (the current stream's
    work first: a blocking copy), the kernel runs on CPU tensors with the arguments' geometry, and every
    staged storage is copied back (the kernel's outputs are among them; inputs come back unchanged)."""
    staged: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
    host_args = []
    for a in args:
        if not (isinstance(a, torch.Tensor) and a.device.type == DEVICE):
            host_args.append(a)
            continue
        storage = a.untyped_storage()
        key = storage.data_ptr()
        if key not in staged:
            staged[key] = (storage, storage.cpu())
        host = torch.empty(0, dtype=a.dtype).set_(staged[key][1], a.storage_offset(), a.size(), a.stride())
        host_args.append(host)
    kernel(*host_args)
    for storage, host in staged.values():
        storage.copy_(host)
