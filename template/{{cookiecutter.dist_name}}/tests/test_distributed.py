"""The collective backend's registration, in this process (the multi-process tests are
tests/distributed, opt-in: `pytest -m distributed`)."""

import datetime

import pytest
import torch

from tests.conftest import DEVICE, requires

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch is built without torch.distributed", allow_module_level=True)


def test_the_device_has_a_default_collective_backend():
    assert dist.Backend.default_device_backend_map[DEVICE] == f"{DEVICE}ccl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_init_process_group_without_a_backend_uses_the_device_backend(tmp_path):
    dist.init_process_group(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        # a c10d ProcessGroup with the device's c10d Backend, as NCCL's for CUDA, and PyTorch's
        # own gloo for CPU tensors
        assert type(dist.group.WORLD) is dist.ProcessGroup
        assert dist.group.WORLD._get_backend(torch.device(DEVICE)).name() == f"{DEVICE}ccl"
        assert type(dist.group.WORLD._get_backend(torch.device("cpu"))) is dist.ProcessGroupGloo
        t = torch.arange(4.0, device=DEVICE)
        dist.all_reduce(t)
        assert t.device.type == DEVICE and t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        out = torch.zeros(4, device=DEVICE)
        dist.all_gather_into_tensor(out, t, async_op=True).wait()
        assert out.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        c = torch.ones(3)
        dist.all_reduce(c)
        assert c.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", [None, "gloo"])
def test_a_cpu_program_gets_plain_gloo(tmp_path, backend):
    """A program that never touches the device, with this backend installed (it autoloads)."""
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        assert type(dist.group.WORLD._get_backend(torch.device("cpu"))) is dist.ProcessGroupGloo
        c = torch.ones(3)
        dist.all_reduce(c)
        assert c.tolist() == [1.0, 1.0, 1.0]
        objects = [None]
        dist.all_gather_object(objects, {"a": 1})
        assert objects == [{"a": 1}]
    finally:
        dist.destroy_process_group()


@requires("host_mapping")
def test_host_view_aliases_device_memory():
    t = torch.zeros(2, 3, device=DEVICE)
    view = torch.ops.{{ cookiecutter.package }}.host_view(t.t())
    assert view.device.type == "cpu" and view.shape == (3, 2) and view.stride() == (1, 3)
    view[1, 0] = 7.0
    assert t.cpu()[0, 1].item() == 7.0
