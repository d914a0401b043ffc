"""The device module, generated methods, autoload and torch.accelerator — as a user meets them."""

import pytest
import torch

from tests.conftest import DEVICE, fresh_process


def test_device_module(mod):
    assert mod.is_available()
    assert mod.device_count() == {{ cookiecutter.num_devices }}
    assert torch.accelerator.current_accelerator().type == DEVICE
    mod.set_device(0)
    assert mod.current_device() == 0
    if mod.device_count() > 1:
        with mod.device(1):
            assert mod.current_device() == 1
            assert torch.empty(2, device=DEVICE).device.index == 1
        assert mod.current_device() == 0
    mod.synchronize()
    torch.accelerator.synchronize()


def test_generated_methods():
    t = torch.arange(4.0)
    d = getattr(t, DEVICE)()
    assert getattr(d, f"is_{DEVICE}") and not getattr(t, f"is_{DEVICE}")
    m = getattr(torch.nn.Linear(2, 2), DEVICE)()
    assert m.weight.device.type == DEVICE
    s = getattr(t.untyped_storage(), DEVICE)()
    assert s.device.type == DEVICE


def test_tensors_live_on_the_device_they_name(mod):
    for i in range(mod.device_count()):
        x = torch.full((3,), float(i), device=f"{DEVICE}:{i}")
        assert x.device == torch.device(DEVICE, i)
        assert x.cpu().tolist() == [float(i)] * 3


def test_invalid_device_index_is_an_error_not_a_crash(mod):
    # RuntimeError, as CUDA, XPU and PyTorch's reference backend raise
    with pytest.raises(RuntimeError, match="invalid|out of range|device"):
        torch.empty(2, device=f"{DEVICE}:{mod.device_count() + 5}")
    with pytest.raises(RuntimeError, match="The device index is out of range: invalid .* device index 99"):
        mod.set_device(99)


def test_device_capability_lists_the_dtypes(mod):
    caps = [torch.accelerator.get_device_capability(f"{DEVICE}:{i}") for i in range(mod.device_count())]
    assert all(torch.float32 in c["supported_dtypes"] and torch.bfloat16 in c["supported_dtypes"] for c in caps)
    assert all(c == caps[0] for c in caps)
    with pytest.raises(RuntimeError, match="device index is out of range"):
        torch.accelerator.get_device_capability(f"{DEVICE}:{mod.device_count()}")


def test_cpu_and_device_tensors_can_swap_data():
    # nn.Module.to() keeps Parameter objects (and so tied weights) only if this holds
    cpu, dev = torch.zeros(3), torch.ones(3, device=DEVICE)
    assert torch._has_compatible_shallow_copy_type(cpu, dev) and torch._has_compatible_shallow_copy_type(dev, cpu)
    cpu.data = dev
    assert cpu.device.type == DEVICE and cpu.sum().item() == 3
    assert not torch._has_compatible_shallow_copy_type(dev, torch.ones(3).to_sparse())


def test_cross_device_op_is_a_clear_error(mod):
    if mod.device_count() < 2:
        pytest.skip("needs two devices")
    a = torch.ones(2, device=f"{DEVICE}:0")
    b = torch.ones(2, device=f"{DEVICE}:1")
    with pytest.raises(RuntimeError, match="device"):
        a + b


# fresh_process's process has done a plain `import torch`, autoload on, and nothing else
PLAIN_IMPORT = fresh_process(f"import torch; print(torch.ones(2, device='{DEVICE}').device.type)")


def test_plain_import_torch_loads_the_backend():
    out = PLAIN_IMPORT.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == DEVICE


LAZY_INIT = fresh_process(f"""
import torch, {{ cookiecutter.package }}
mod = getattr(torch, '{DEVICE}')
print(mod.is_initialized())
mod._lazy_init()
print(mod.is_initialized())
mod.init()
print(mod.is_initialized())
""")


def test_lazy_initialisation():
    # Nothing initialises the runtime before the first use; _lazy_init (what PyTorch calls before
    # the first tensor on the device) runs the hooks' init() once, and is_initialized reflects it.
    out = LAZY_INIT.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


FORK_BEFORE_AND_AFTER_INIT = fresh_process(f"""
import os, torch, {{ cookiecutter.package }}
mod = getattr(torch, '{DEVICE}')
pid = os.fork()
if pid == 0:  # forked before the parent used the device: fine
    os._exit(0 if torch.ones(2, device='{DEVICE}').sum().item() == 2 and not mod._is_in_bad_fork() else 5)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
torch.ones(2, device='{DEVICE}')
print(mod.is_initialized())
pid = os.fork()
if pid == 0:  # forked after: PyTorch's flag is set and the device refuses
    ok = mod._is_in_bad_fork() and not mod.is_initialized()
    try:
        torch.zeros(2, device='{DEVICE}')
    except RuntimeError as e:
        os._exit(0 if ok and 'Cannot re-initialize' in str(e) else 6)
    os._exit(7)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
""")


def test_first_tensor_initialises_the_device_and_a_fork_before_that_may_use_it():
    out = FORK_BEFORE_AND_AFTER_INIT.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True", "0"]


@pytest.mark.skipif({{ cookiecutter.num_devices }} < 2, reason="needs two devices")
def test_storage_resize_stays_on_the_storages_device(mod):
    mod.set_device(0)
    x = torch.arange(4.0, device=f"{DEVICE}:1")
    storage = x.untyped_storage()
    storage.resize_(64)
    assert storage.device == torch.device(DEVICE, 1)
    assert storage.nbytes() == 64
    assert torch.equal(x.cpu(), torch.arange(4.0))
    assert mod.current_device() == 0
