"""torch.compile on the device: Dynamo traces it, Inductor compiles fused kernels for it, and the
compiled code computes what eager mode computes (compiler/ in the package).

Opt-in like the conformance suite, because Inductor compiles C++ for every graph (a minute or so
on 2 cores the first time; later runs reuse Inductor's cache): `pytest -m compile`.
"""

import copy
import os

import pytest
import torch

from tests.conftest import DEVICE, run_python

pytestmark = pytest.mark.compile


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Dynamo is imported here, not at the top: the quick suite collects this file before it deselects
    # it, and importing Dynamo costs seconds
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 5),
    )


@pytest.mark.parametrize("make, shape", [(_mlp, (8, 16)), (_cnn, (4, 3, 8, 8))], ids=["mlp", "cnn"])
def test_forward_and_backward_match_eager(make, shape):
    eager = make().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(shape).to(DEVICE)
    target = torch.randn(shape[0], eager[-1].out_features).to(DEVICE)

    def step(model):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, target)
        loss.backward()
        return out, loss

    out_e, loss_e = step(eager)
    out_c, loss_c = step(compiled)
    assert out_c.device.type == DEVICE
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-5)
    for (name, pe), pc in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        assert pc.grad is not None and pc.grad.device.type == DEVICE, name
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")
    # batch norm's running statistics, updated inside the compiled graph, reach the module
    for (name, be), bc in zip(eager.named_buffers(), compiled_model.buffers(), strict=True):
        torch.testing.assert_close(bc, be, rtol=1e-4, atol=1e-5, msg=f"buffer {name}")


def test_pointwise_and_reduction_run_as_fused_kernels_not_on_the_fallback():
    def f(x, y):
        z = (x.sin() * y + 1).tanh()
        return z.sum(dim=1), z.amax()

    x, y = torch.randn(64, 128, device=DEVICE), torch.randn(64, 128, device=DEVICE)
    mod = getattr(torch, DEVICE)
    mod.reset_fallback_counts()
    expected = f(x, y)
    eager_fallbacks = mod.fallback_counts()
    assert eager_fallbacks, "eager mode ran everything natively: this test cannot tell compiled code from eager"

    compiled = torch.compile(f, fullgraph=True)
    compiled(x, y)  # compiles
    mod.reset_fallback_counts()
    from torch._inductor.utils import run_and_get_code

    result, (code,) = run_and_get_code(compiled, x, y)
    assert mod.fallback_counts() == {}, f"the compiled graph ran operators on the CPU fallback: {mod.fallback_counts()}"
    assert "aten." not in code.split("def call(")[-1], "the compiled graph calls ATen operators instead of fused kernels"
    for got, want in zip(result, expected, strict=True):
        assert got.device.type == DEVICE
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_no_recompilation_on_a_second_call_and_dynamic_shapes():
    def f(x):
        return (x * 2).relu().sum(dim=-1)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    a = torch.randn(5, 7, device=DEVICE)
    torch.testing.assert_close(compiled(a), f(a))
    with torch._dynamo.config.patch(error_on_recompile=True):
        torch.testing.assert_close(compiled(a), f(a))  # same input: the cached graph
        for rows, cols in [(9, 7), (3, 11)]:  # dynamic shapes: one graph for every size
            b = torch.randn(rows, cols, device=DEVICE)
            torch.testing.assert_close(compiled(b), f(b))


def test_autocast_under_compile_matches_eager_autocast():
    model = _mlp().to(DEVICE)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(8, 16, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        eager_out = model(x)
        compiled_out = compiled(x)
    assert eager_out.dtype == torch.bfloat16, "autocast did not take effect in eager mode"
    assert compiled_out.device.type == DEVICE and compiled_out.dtype == eager_out.dtype
    torch.testing.assert_close(compiled_out, eager_out, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(getattr(torch, DEVICE).device_count() < 2, reason="needs two devices")
def test_compiled_code_runs_on_the_inputs_device():
    def f(x):
        return torch.cos(x) + torch.ones_like(x)

    x = torch.randn(32, device=f"{DEVICE}:1")
    out = torch.compile(f, fullgraph=True)(x)
    assert out.device == x.device
    torch.testing.assert_close(out, f(x))
    assert getattr(torch, DEVICE).current_device() == 0


def test_dynamo_knows_the_device():
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device(DEVICE)
    mod = getattr(torch, DEVICE)
    assert iface.device_count() == mod.device_count() and iface.is_available()
    assert iface.get_device_properties(0).multi_processor_count >= 1
    assert isinstance(iface.get_raw_stream(0), int)
    s = iface.Stream(device=DEVICE)
    with iface.stream(s):
        assert iface.current_stream() == s
    assert iface.current_stream() != s


def test_cpp_wrapper_is_refused_with_a_reason():
    x = torch.randn(8, device=DEVICE)
    with torch._inductor.config.patch(cpp_wrapper=True):
        with pytest.raises(Exception, match="not supported on " + DEVICE):
            torch.compile(lambda t: t.sin() + 1)(x)


def test_importing_the_backend_does_not_import_the_compiler():
    code = (
        "import sys, torch\n"
        f"assert torch.device('{DEVICE}').type == '{DEVICE}'\n"
        f"torch.randn(2, device='{DEVICE}')\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))\n"
    )
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = run_python(code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"loading the backend imported {proc.stdout.strip()}"


def test_a_backend_loaded_after_inductor_still_compiles():
    # autoload off: Dynamo and Inductor are imported and set up before the backend is
    code = (
        "import torch, torch._dynamo, torch._inductor.codegen.common as c\n"
        "c.init_backend_registration()\n"
        "import {{ cookiecutter.package }}\n"
        f"x = torch.randn(16, device='{DEVICE}')\n"
        "out = torch.compile(lambda t: t.exp() - 1, fullgraph=True)(x)\n"
        "torch.testing.assert_close(out, x.exp() - 1)\n"
        "print(out.device)\n"
    )
    proc = run_python(code, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"{DEVICE}:0"
