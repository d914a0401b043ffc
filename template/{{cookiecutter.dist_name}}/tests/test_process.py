"""Process-level behaviour: clean interpreter exit, fork without re-initialisation, autoload turned
off, a process where another backend holds PrivateUse1, and a device tensor sent to another process
by a driver that cannot share device memory (the sharing itself: tests/distributed/test_ipc.py)."""

import json
import os

import pytest

from tests.conftest import DEVICE, fresh_process

TRAIN = f"""
import torch
m = torch.nn.Linear(4, 4).to('{DEVICE}')
loss = m(torch.randn(2, 4, device='{DEVICE}')).sum()
loss.backward()
print('ok')
"""
# an exit race shows only sometimes: five processes, started together (more contention at exit);
# each ends through the interpreter's finalization
CLEAN_EXIT = fresh_process(TRAIN, copies=5)


def test_clean_exit_after_backward():
    for run in CLEAN_EXIT.results():
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "ok"
        assert "terminate called" not in run.stderr


EXCEPTION_IN_A_KERNEL = fresh_process(f"""
import torch
try:
    torch.empty(2, device='{DEVICE}:99')
except Exception as e:
    print(type(e).__name__)
x = torch.ones(2, device='{DEVICE}')
""")


def test_clean_exit_after_an_exception_in_a_kernel():
    out = EXCEPTION_IN_A_KERNEL.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RuntimeError"


USE_AFTER_FORK = fresh_process(f"""
import os, torch
torch.ones(2, device='{DEVICE}')
pid = os.fork()
if pid == 0:
    try:
        torch.ones(2, device='{DEVICE}')
        os._exit(3)
    except RuntimeError as e:
        os._exit(0 if 'fork' in str(e) else 4)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
""")


def test_use_after_fork_is_a_clear_error():
    out = USE_AFTER_FORK.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


# One new interpreter with TORCH_DEVICE_BACKEND_AUTOLOAD=0 at import serves the two tests below:
# `import torch` leaves the backend out; then another backend takes PrivateUse1 first.
AUTOLOAD_OFF = fresh_process(f"""
import torch
print(hasattr(torch, '{DEVICE}'), flush=True)
torch.utils.rename_privateuse1_backend("otherdev")
import warnings
try:
    import {{ cookiecutter.package }}
except ImportError as e:
    print("refused:", "otherdev" in str(e))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import {{ cookiecutter.package }}_autoload
    {{ cookiecutter.package }}_autoload.load()
print("warned:", any("failed to load" in str(w.message) for w in caught))
print(torch.ones(2).sum().item())
""", env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))


def test_autoload_can_be_turned_off():
    out = AUTOLOAD_OFF.result()
    assert out.stdout.split()[:1] == ["False"], (out.stdout, out.stderr)


def test_another_backend_holding_private_use1_is_refused_without_an_abort():
    # another backend got PrivateUse1 first: loading this one must not abort the process
    out = AUTOLOAD_OFF.result()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "refused:", "True", "warned:", "True", "2.0"], out.stdout


UNSUPPORTED_SHARING = fresh_process("from tests.distributed.ipc_workers import main; main('unsupported', 'spawn')")


def test_a_driver_without_ipc_raises_naming_it_instead_of_waiting():
    run = UNSUPPORTED_SHARING.result()
    assert run.returncode == 0, run.stderr[-4000:]
    s = json.loads(run.stdout.strip().splitlines()[-1])
    if s["supported"]:
        pytest.skip(f"the {DEVICE} driver has the 'ipc' capability (driver.h)")
    # a Process's arguments: the sender raises; a Queue's message: the receiver raises, not waits
    for error in (s["sent"], s["error"]):
        assert error is not None and error.startswith("RuntimeError"), s
        assert "'ipc'" in error and "driver.h" in error
    assert s["child_exit"] == 0
