"""The device module's contract: everything PyTorch's own Python reads from `torch.{{ cookiecutter.device }}`.

PyTorch reaches a backend outside the dispatcher through its device module, and most of those
reads have a silent default: without `_initialized`, torch.utils.checkpoint does not restore the
device's RNG state and recomputes dropout with other masks (wrong gradients, no error). The list
below is the template's manifest ("device_module" in backendgen's template.json), found by
reading torch's sources; `backendgen check` names a read a newer torch adds. Each attribute must
exist, and those with a meaning are compared with what torch.cuda's do.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tests.conftest import DEVICE, fresh_process

CONTRACT = [
{%- for name in cookiecutter._manifest.device_module.provides %}
    "{{ name }}",
{%- endfor %}
]


@pytest.mark.parametrize("name", CONTRACT)
def test_attribute_exists(name):
    obj = getattr(torch, DEVICE)
    for part in name.split("."):
        assert hasattr(obj, part), f"torch.{DEVICE} has no {name}: PyTorch's own code reads it"
        obj = getattr(obj, part)


INITIALIZED_FLAG = fresh_process(f"""
import os, torch, {{ cookiecutter.package }}
mod = getattr(torch, {DEVICE!r})
print(mod._initialized)
torch.ones(1, device={DEVICE!r})
print(mod._initialized, flush=True)  # a child would inherit (and write again) what is still buffered
pid = os.fork()
if pid == 0:
    print(mod._initialized, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
""")


def test_initialized_follows_lazy_init_and_fork():
    # as torch.cuda._initialized: False before the first use, True after it, False in a child
    # forked after the parent initialised the device
    out = INITIALIZED_FLAG.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False"]


LAZY_CALL = fresh_process(f"""
import torch, {{ cookiecutter.package }}
mod = getattr(torch, {DEVICE!r})
ran = []
mod._lazy_call(lambda: ran.append("first seed"), seed=True)
mod._lazy_call(lambda: ran.append("second seed"), seed=True)
mod._lazy_call(lambda: ran.append("call"))
print(len(ran))
torch.ones(1, device={DEVICE!r})
print(",".join(ran).replace(" ", "_"))
mod._lazy_call(lambda: ran.append("now"))
print(ran[-1])
""")


def test_lazy_call_defers_until_the_device_is_initialised():
    # torch.accelerator (torch 2.14 and later) defers seeding through the device module's _lazy_call
    out = LAZY_CALL.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "second_seed,call", "now"]


def test_default_generators_and_get_generator(mod):
    gens = mod.default_generators
    assert isinstance(gens, tuple) and len(gens) == mod.device_count()
    assert all(isinstance(g, torch.Generator) and g.device.type == DEVICE for g in gens)
    assert mod._get_generator(torch.device(DEVICE, 0)).device == torch.device(DEVICE, 0)
    mod.manual_seed_all(7)
    assert gens[0].initial_seed() == 7
    state = mod._get_generator(torch.device(DEVICE, 0)).get_state()
    a = torch.rand(4, device=f"{DEVICE}:0")
    gens[0].set_state(state)
    assert torch.equal(a, torch.rand(4, device=f"{DEVICE}:0"))


def test_get_device_index_as_torch_cuda_answers(mod):
    get = mod._utils._get_device_index
    assert get(torch.device(DEVICE, 1 if mod.device_count() > 1 else 0)) == (1 if mod.device_count() > 1 else 0)
    assert get(f"{DEVICE}:0") == 0
    assert get(0) == 0
    assert get(DEVICE, optional=True) == mod.current_device()
    assert get("cpu", allow_cpu=True) == -1
    with pytest.raises(ValueError):
        get(DEVICE)  # no index, not optional
    with pytest.raises(ValueError):
        get("cpu")


def test_memory_summary_reports_the_allocators_figures(mod):
    x = torch.empty(1 << 20, device=DEVICE)
    text = mod.memory_summary()
    assert f"{DEVICE}:0" in text and "allocated bytes" in text and "reserved bytes" in text
    del x


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_same_mask(use_reentrant):
    torch.manual_seed(0)
    x = torch.ones(64, device=DEVICE, requires_grad=True)
    y = checkpoint(lambda t: F.dropout(t, 0.5) * 1.0, x, use_reentrant=use_reentrant)
    y.sum().backward()
    # the gradient is 2 where the forward kept an element and 0 where it dropped it: the
    # recomputation must draw the same mask
    assert torch.equal((y != 0).cpu(), (x.grad != 0).cpu())


def test_legacy_typed_storages_are_the_devices():
    import warnings

    mod = getattr(torch, DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        x = torch.ones(3, device=DEVICE)
        assert x.storage_type() is mod.FloatStorage
        assert torch.ones(2, dtype=torch.int64, device=DEVICE).storage_type() is mod.LongStorage
        assert isinstance(x.storage(), mod.FloatStorage) and not isinstance(x.storage(), torch.FloatStorage)
        assert not isinstance(x.cpu().storage(), mod.FloatStorage)
        made = mod.DoubleStorage(4)
        assert made.device.type == DEVICE and made.dtype == torch.float64 and made.size() == 4
