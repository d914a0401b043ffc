"""LSTM and GRU layers and cells run on the device as on the CPU (csrc/aten/rnn.cpp): outputs,
gradients of inputs and parameters, and a few optimizer steps, from the same initial weights. A
float32 nn.LSTM runs each layer's whole sequence as one call, as the CPU does."""

import collections
import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import DEVICE, queued_kernels


def _to(value, device):
    """`value` (a tensor, a tuple of them or None) on `device`, as a new leaf that records gradients."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value.detach().to(device).requires_grad_(value.is_floating_point())


def _leaves(value):
    if value is None:
        return []
    if isinstance(value, tuple):
        return [t for v in value for t in _leaves(v)]
    return [value]


def _tensors(output):
    """The tensors of a module's output: (out, h) or (out, (h, c)), a PackedSequence unpacked."""
    if isinstance(output, torch.nn.utils.rnn.PackedSequence):
        return [output.data]
    if isinstance(output, tuple):
        return [t for o in output for t in _tensors(o)]
    return [output]


def _run(module, device, inputs, hidden, lengths=None, batch_first=False):
    """Forward and backward of `module` (already on `device`): the outputs and the gradients of the
    inputs, of the initial state and of the parameters, all on the CPU."""
    x = _to(inputs, device)
    h = _to(hidden, device)
    arg = x
    if lengths is not None:
        arg = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    out = module(arg) if h is None else module(arg, h)
    tensors = _tensors(out)
    if lengths is not None:  # the padded positions of the output are zeros on both devices
        padded, _ = pad_packed_sequence(out[0], batch_first=batch_first)
        tensors = [padded] + tensors[1:]
    torch.manual_seed(1)
    weights = [torch.randn(t.shape) for t in tensors]  # a loss that weighs every output element
    loss = sum((t * w.to(device)).sum() for t, w in zip(tensors, weights))
    loss.backward()
    leaves = [x] + _leaves(h) + list(module.parameters())
    return [t.detach().cpu() for t in tensors], [g.grad.cpu() for g in leaves]


def _compare(make, inputs, hidden=None, lengths=None, batch_first=False):
    torch.manual_seed(0)
    cpu_module = make()
    dev_module = copy.deepcopy(cpu_module).to(DEVICE)
    assert all(p.device.type == DEVICE for p in dev_module.parameters())
    cpu_out, cpu_grads = _run(cpu_module, "cpu", inputs, hidden, lengths, batch_first)
    dev_out, dev_grads = _run(dev_module, DEVICE, inputs, hidden, lengths, batch_first)
    assert len(dev_out) == len(cpu_out)
    for a, b in zip(dev_out, cpu_out):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(dev_grads, cpu_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
def test_layers_match_cpu(kind, bidirectional, batch_first):
    layer = getattr(torch.nn, kind)
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4) if batch_first else torch.randn(5, 3, 4)
    directions = 2 if bidirectional else 1
    h0 = torch.randn(2 * directions, 3, 6)
    hidden = (h0, torch.randn(2 * directions, 3, 6)) if kind == "LSTM" else h0
    _compare(lambda: layer(4, 6, num_layers=2, bidirectional=bidirectional, batch_first=batch_first),
             x, hidden, batch_first=batch_first)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_layers_without_initial_state_or_bias(kind):
    layer = getattr(torch.nn, kind)
    torch.manual_seed(0)
    _compare(lambda: layer(4, 6, bias=False), torch.randn(5, 3, 4))


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # the CPU run's
def test_lstm_with_projection():
    torch.manual_seed(0)
    _compare(lambda: torch.nn.LSTM(4, 6, num_layers=2, proj_size=3), torch.randn(5, 3, 4))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
def test_packed_sequences_match_cpu(kind, batch_first):
    layer = getattr(torch.nn, kind)
    torch.manual_seed(0)
    x = torch.randn(4, 6, 3) if batch_first else torch.randn(6, 4, 3)
    lengths = torch.tensor([6, 2, 4, 5])
    _compare(lambda: layer(3, 5, num_layers=2, bidirectional=True, batch_first=batch_first),
             x, lengths=lengths, batch_first=batch_first)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_cells_match_cpu(kind, bias):
    cell = getattr(torch.nn, kind)
    torch.manual_seed(0)
    h0 = torch.randn(3, 6)
    hidden = (h0, torch.randn(3, 6)) if kind == "LSTMCell" else h0
    _compare(lambda: cell(4, 6, bias=bias), torch.randn(3, 4), hidden)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_unbatched_cells_without_state(kind):
    torch.manual_seed(0)
    _compare(lambda: getattr(torch.nn, kind)(4, 6), torch.randn(4))


def test_lstm_gradient_of_the_cell_state_alone():
    """Only cy feeds the loss: the backward gets no gradient for hy (grad_hy undefined)."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(4, 6)
    x, h, c = torch.randn(3, 4), torch.randn(3, 6), torch.randn(3, 6)
    grads = []
    for device, module in (("cpu", cell), (DEVICE, copy.deepcopy(cell).to(DEVICE))):
        xs = _to(x, device)
        _, cy = module(xs, (h.to(device), c.to(device)))
        cy.sum().backward()
        grads.append([xs.grad.cpu()] + [p.grad.cpu() for p in module.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_double_backward_matches_cpu(kind):
    """create_graph=True: autograd uses PyTorch's differentiable formulas instead of the fused backward."""
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(3, 4)
    x = torch.randn(2, 2, 3)
    results = []
    for device, module in (("cpu", layer), (DEVICE, copy.deepcopy(layer).to(DEVICE))):
        xs = _to(x, device)
        out, _ = module(xs)
        (g,) = torch.autograd.grad(out.pow(2).sum(), xs, create_graph=True)
        g.sum().backward()
        results.append([g.detach().cpu()] + [p.grad.cpu() for p in module.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _train(model, device, steps=3):
    torch.manual_seed(0)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(4, 7, 3).to(device)
    y = torch.randn(4, 2).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out, _ = model[0](x)
        loss = torch.nn.functional.mse_loss(model[1](out[:, -1]), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_optimizer_steps_match_cpu(kind):
    torch.manual_seed(0)
    model = torch.nn.ModuleList([getattr(torch.nn, kind)(3, 8, num_layers=2, batch_first=True), torch.nn.Linear(8, 2)])
    cpu_losses, cpu_params = _train(copy.deepcopy(model), "cpu")
    dev_losses, dev_params = _train(copy.deepcopy(model), DEVICE)
    torch.testing.assert_close(dev_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(dev_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_cells_follow_float(dtype):
    """Half and bfloat16 compute in float (as CUDA does): close to the float result, in their dtype."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6).to(DEVICE)
    gru = torch.nn.GRU(4, 6).to(DEVICE)
    x = torch.randn(3, 2, 4, device=DEVICE)
    for module in (lstm, gru):
        ref, _ = module(x)
        low, _ = copy.deepcopy(module).to(dtype)(x.to(dtype))
        assert low.dtype == dtype and low.device.type == DEVICE
        torch.testing.assert_close(low.float().cpu(), ref.cpu(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "LSTMCell", "GRUCell"])
def test_autocast_mixes_lower_precision_gates_with_a_float_state(kind):
    """Under autocast the gate matmuls run in bfloat16 while the state stays float: the cells take
    both, give float results (as the CPU's unfused cells promote) close to float's, and differentiate."""
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(4, 6).to(DEVICE)
    x = torch.randn(3, 2, 4) if kind in ("LSTM", "GRU") else torch.randn(2, 4)
    x = x.to(DEVICE).requires_grad_()
    ref = _tensors(module(x))[0]
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = _tensors(module(x))[0]
    assert out.dtype == torch.float32 and out.device.type == DEVICE
    torch.testing.assert_close(out.cpu(), ref.detach().cpu(), rtol=5e-2, atol=5e-2)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad.cpu()).all()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())


def test_cells_are_native_not_fallback():
    """The fused cells have no CPU kernel: they are registered natively (the fallback could not run them)."""
    for op in ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
               "_thnn_fused_gru_cell_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "PrivateUse1"), op
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CPU"), op


def test_mismatched_devices_are_refused():
    gates = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(RuntimeError, match="device|cpu"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(2, 2))


class _Calls(TorchDispatchMode):
    """Counts the ATen operators called below autograd."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.name()] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_a_float_lstm_runs_each_layers_sequence_as_one_call(bidirectional):
    """As on the CPU: one aten::mkldnn_rnn_layer per layer and direction, and one backward each,
    instead of a fused cell and two matmuls per time step."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=bidirectional).to(DEVICE)
    x = torch.randn(7, 3, 4, device=DEVICE, requires_grad=True)
    with _Calls() as calls:
        out, _ = lstm(x)
        out.sum().backward()
    per_pass = 2 * (2 if bidirectional else 1)
    assert calls.count["aten::mkldnn_rnn_layer"] == per_pass, calls.count
    assert calls.count["aten::mkldnn_rnn_layer_backward"] == per_pass, calls.count
    assert calls.count["aten::_thnn_fused_lstm_cell"] == 0, calls.count


def test_an_lstm_the_sequence_path_does_not_take_still_runs_cell_by_cell():
    """No bias: PyTorch's composite (a fused cell per time step), as before, and still the CPU's result."""
    lstm = torch.nn.LSTM(4, 6, bias=False).to(DEVICE)
    with _Calls() as calls:
        lstm(torch.randn(5, 3, 4, device=DEVICE))
    assert calls.count["aten::mkldnn_rnn_layer"] == 0 and calls.count["aten::_thnn_fused_lstm_cell"] == 5


def test_an_lstm_in_inference_mode_matches_cpu():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True)
    x = torch.randn(3, 5, 4)
    expected = lstm(x)[0].detach()
    dev = copy.deepcopy(lstm).to(DEVICE)
    with torch.inference_mode(), torch.profiler.profile() as prof:  # a dispatch mode would see lstm alone
        got = dev(x.to(DEVICE))[0]
    calls = collections.Counter({e.key: e.count for e in prof.key_averages()})  # the kernels' CPU calls too
    assert calls["aten::mkldnn_rnn_layer"] >= 2 and calls["aten::_thnn_fused_lstm_cell"] == 0, calls
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


@queued_kernels
@pytest.mark.usefixtures("drained")
def test_an_lstm_training_step_is_queued(mod):
    """Forward and backward return before the stream has run them (the sequence calls are queued)."""
    lstm = torch.nn.LSTM(4, 6, num_layers=2).to(DEVICE)
    x = torch.randn(7, 3, 4, device=DEVICE)
    for _ in range(3):  # the fallback queues a kind of call once it has seen it run
        lstm(x)[0].sum().backward()
    mod.synchronize()
    with mod._held_stream():
        lstm(x)[0].sum().backward()
        done = torch.Event(device=DEVICE)
        done.record()
        assert not done.query(), "the LSTM's forward or backward waited for the stream"
    mod.synchronize()
