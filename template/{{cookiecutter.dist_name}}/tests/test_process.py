"""Process-level behaviour: clean interpreter exit, fork without re-initialisation, and a process
where another backend holds PrivateUse1."""

import subprocess
import sys

from tests.conftest import DEVICE, run_python

TRAIN = f"""
import torch
m = torch.nn.Linear(4, 4).to('{DEVICE}')
loss = m(torch.randn(2, 4, device='{DEVICE}')).sum()
loss.backward()
print('ok')
"""


def test_clean_exit_after_backward():
    # an exit race shows only sometimes: five interpreters, started together (less wall time than
    # one after another, and more contention at exit)
    runs = [subprocess.Popen([sys.executable, "-c", TRAIN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(5)]
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
        assert stdout.strip() == "ok"
        assert "terminate called" not in stderr


def test_clean_exit_after_an_exception_in_a_kernel():
    code = f"""
import torch
try:
    torch.empty(2, device='{DEVICE}:99')
except Exception as e:
    print(type(e).__name__)
x = torch.ones(2, device='{DEVICE}')
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RuntimeError"


def test_use_after_fork_is_a_clear_error():
    code = f"""
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
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_another_backend_holding_private_use1_is_refused_without_an_abort():
    # another backend got PrivateUse1 first: loading this one must not abort the process
    code = """
import os, warnings
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
import torch
torch.utils.rename_privateuse1_backend("otherdev")
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
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused:", "True", "warned:", "True", "2.0"], out.stdout
