"""Graph capture and replay (torch.accelerator.Graph; csrc/runtime/graphs.cpp over the driver's
`graphs` capability), as a CUDA-graph user meets it: captured work replays equal to eager on the
same memory, static inputs change the results, a whole training step replays, the calls CUDA
forbids during capture raise and leave the device usable, pools are shared, random ops draw fresh
numbers on every replay and follow manual_seed, and a graph is reset and captured again."""

import copy
import threading

import pytest
import torch

from tests.conftest import CAPABILITIES, DEVICE, requires

graphs = requires("graphs")


def _side_stream() -> torch.Stream:
    s = torch.Stream(device=DEVICE)
    s.wait_stream(torch.accelerator.current_stream())
    return s


def _capture(fn, **graph_args):
    """Captures fn() into a new graph on a side stream: (graph, what fn returned)."""
    g = torch.accelerator.Graph(**graph_args)
    with _side_stream(), g:
        out = fn()
    return g, out


def _chain(x: torch.Tensor) -> torch.Tensor:
    y = x
    for i in range(10):  # native kernels (add, mul) and CPU-fallback ones (sin, exp)
        y = (y * 0.9 + i).sin().exp()
    return y


@graphs
def test_a_captured_chain_replays_equal_to_eager():
    x = torch.randn(256, device=DEVICE)
    expected = _chain(x).cpu()
    g, out = _capture(lambda: _chain(x))
    g.replay()
    assert torch.equal(out.cpu(), expected)
    g.replay()  # again, on the same memory
    assert torch.equal(out.cpu(), expected)


@graphs
def test_a_fallback_call_on_the_capturing_devices_tensors_is_captured_whatever_the_current_device(mod):
    # sin reaches the CPU fallback: during a capture it must be queued into the capture of the
    # device its tensors are on, not judged by the current device's (which is not capturing)
    if mod.device_count() < 2:
        pytest.skip("needs two devices")
    x = torch.randn(256, device=f"{DEVICE}:1")
    expected = x.sin().cpu()
    with mod.device(1):
        s, g = _side_stream(), torch.accelerator.Graph()
        with s, g:
            with mod.device(0):
                out = x.sin()
    g.replay()
    assert torch.equal(out.cpu(), expected)


@graphs
def test_updating_static_inputs_changes_the_results():
    x = torch.zeros(8, device=DEVICE)
    g, out = _capture(lambda: x * 2 + 1)
    for v in (1.0, 2.5, -3.0):
        x.fill_(v)
        g.replay()
        assert out.cpu().tolist() == [v * 2 + 1] * 8


@graphs
@requires("host_tasks")
def test_a_replay_is_queued_on_the_current_stream(mod):
    x = torch.ones(4, device=DEVICE)
    g, out = _capture(lambda: x + 1)
    with mod._held_stream():
        g.replay()  # returns at once, behind the held stream
        done = torch.Event()
        done.record()
        assert not done.query()
    done.synchronize()
    assert out.cpu().tolist() == [2.0] * 4


def _model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )


@graphs
def test_a_whole_training_step_replays_equal_to_eager():
    torch.manual_seed(0)
    model = _model().to(DEVICE)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, capturable=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, capturable=True)
    batches = [(torch.randn(8, 16, device=DEVICE), torch.randn(8, 4, device=DEVICE)) for _ in range(6)]
    x, t = torch.empty(8, 16, device=DEVICE), torch.empty(8, 4, device=DEVICE)  # static inputs

    def step(m, o, inp, target):
        o.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(m(inp), target)
        loss.backward()
        o.step()
        return loss

    torch.manual_seed(1)  # dropout draws: the same for both models, eager or replayed
    s = _side_stream()
    with s:  # warm-up on a side stream, as for CUDA graphs
        for inp, target in batches[:2]:
            x.copy_(inp)
            t.copy_(target)
            step(model, opt, x, t)
    torch.accelerator.current_stream().wait_stream(s)
    g = torch.accelerator.Graph()
    opt.zero_grad(set_to_none=True)
    with s, g:
        static_loss = torch.nn.functional.mse_loss(model(x), t)
        static_loss.backward()
        opt.step()
    losses = []
    for inp, target in batches[2:]:
        x.copy_(inp)
        t.copy_(target)
        g.replay()
        losses.append(static_loss.item())

    torch.manual_seed(1)
    ref_losses = [step(ref, ref_opt, inp, target).item() for inp, target in batches]
    assert losses == pytest.approx(ref_losses[2:], rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu())


@graphs
def test_kernels_with_optional_and_list_arguments_replay_on_new_inputs():
    """Every replay reads the static inputs' new values: batch norm's forward and backward (optional
    weight, bias and running statistics) and a concatenation (a list of tensors), replayed three
    times, each equal to eager on the same values."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(6).to(DEVICE)
    x = torch.randn(8, 6, device=DEVICE, requires_grad=True)

    def step():
        y = torch.cat([bn(x), x * 2], dim=1)
        y.square().sum().backward()
        return y

    step()  # warm-up
    x.grad = None
    bn.zero_grad(set_to_none=False)
    state = copy.deepcopy(bn.state_dict())
    g, static_y = _capture(step)
    for i in range(3):
        value = torch.randn(8, 6) * (i + 1)
        with torch.no_grad():
            x.copy_(value)
            x.grad.zero_()
            bn.weight.grad.zero_()
            bn.bias.grad.zero_()
        g.replay()
        ref = torch.nn.BatchNorm1d(6)
        ref.load_state_dict(state)
        rx = value.clone().requires_grad_()
        ry = torch.cat([ref(rx), rx * 2], dim=1)
        ry.square().sum().backward()
        state = copy.deepcopy(ref.state_dict())
        torch.testing.assert_close(static_y.cpu(), ry.detach())
        torch.testing.assert_close(x.grad.cpu(), rx.grad)
        torch.testing.assert_close(bn.weight.grad.cpu(), ref.weight.grad)
        torch.testing.assert_close(bn.running_mean.cpu(), ref.running_mean)


@graphs
@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_captured_backward_runs_in_every_capture_mode(mode):
    """The autograd engine runs backward on its device thread, on the capturing stream."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3).to(DEVICE)
    x = torch.randn(5, 8, device=DEVICE)
    model(x).square().sum().backward()  # warm-up
    expected = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    g, _ = _capture(lambda: model(x).square().sum().backward(), capture_error_mode=mode)
    g.replay()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad.cpu(), e)


def _sync(x):
    torch.accelerator.synchronize()


def _stream_sync(x):
    torch.accelerator.current_stream().synchronize()


def _event_query(x):
    e = torch.Event()
    e.record()
    e.query()


def _event_sync(x):
    e = torch.Event()
    e.record()
    e.synchronize()


def _default_stream_work(x):
    previous = torch.accelerator.current_stream()
    torch.accelerator.set_stream(getattr(torch, DEVICE).default_stream())
    try:
        x.add_(1)
    finally:
        torch.accelerator.set_stream(previous)


FORBIDDEN = {
    "synchronize": (_sync, "synchronizing the device"),
    "stream.synchronize": (_stream_sync, "synchronizing the capturing stream"),
    ".item()": (lambda x: x.sum().item(), "_local_scalar_dense"),
    ".cpu()": (lambda x: x.cpu(), "copy device to host"),
    "blocking copy from the host": (lambda x: x.copy_(torch.ones(x.shape)), "copy host to device"),
    "nonzero (a data-dependent size)": (lambda x: x.nonzero(), "waits for its stream"),
    "event.query": (_event_query, "querying an event recorded in the capture"),
    "event.synchronize": (_event_sync, "synchronizing an event recorded in the capture"),
    "work on the default stream": (_default_stream_work, "work launched on the default stream"),
}


@graphs
@pytest.mark.parametrize("call", list(FORBIDDEN))
def test_a_call_forbidden_during_capture_raises_and_leaves_the_device_usable(call):
    fn, named = FORBIDDEN[call]
    x = torch.ones(16, device=DEVICE)
    s = _side_stream()
    g = torch.accelerator.Graph()
    # torch.AcceleratorError (a RuntimeError), as CUDA raises for a call a capture does not permit
    with pytest.raises(torch.AcceleratorError, match="not permitted|invalidated") as raised, s, g:
        y = x * 2
        fn(x)
    messages = str(raised.value) + "\n" + str(raised.value.__context__)
    assert named in messages and "capturing" in messages
    assert not s.is_capturing()
    # the device and the same stream work, and capture again
    assert (x * 3).cpu().tolist() == [3.0] * 16
    g.reset()
    with s, g:
        y = x * 4
    g.replay()
    assert y.cpu().tolist() == [4.0] * 16


@graphs
def test_a_stream_joined_by_an_event_is_captured_and_must_join_back(mod):
    """Work forked to a second stream (it waits for the capturing stream) is part of the graph; the
    capture must wait for it before it ends, else it fails naming the unjoined stream."""
    x = torch.ones(8, device=DEVICE)
    g = torch.accelerator.Graph()
    with mod.graph(g):
        side = torch.Stream(device=DEVICE)
        side.wait_stream(torch.accelerator.current_stream())
        with mod.stream(side):
            y = x * 2
        z = x + 1
        torch.accelerator.current_stream().wait_stream(side)
        w = y + z
    x.fill_(3)
    g.replay()
    assert w.cpu().tolist() == [10.0] * 8
    with pytest.raises(torch.AcceleratorError, match="did not join back"), mod.graph(torch.accelerator.Graph()):
        forked = torch.Stream(device=DEVICE)
        forked.wait_stream(torch.accelerator.current_stream())
        with mod.stream(forked):
            x.mul(5)
    assert not forked.is_capturing() and (x * 2).cpu().tolist() == [6.0] * 8


@graphs
def test_a_capture_on_the_default_stream_raises():
    with pytest.raises(RuntimeError, match="default stream"), torch.accelerator.Graph():
        pass


@graphs
def test_a_capture_in_relaxed_mode_lets_its_thread_use_the_default_stream():
    x = torch.ones(4, device=DEVICE)
    g, out = _capture(lambda: (_default_stream_work(x), x * 2)[1], capture_error_mode="relaxed")
    torch.accelerator.synchronize()
    assert x.cpu().tolist() == [2.0] * 4  # the default-stream work ran, not captured
    g.replay()
    assert out.cpu().tolist() == [4.0] * 4


@graphs
@pytest.mark.parametrize("mode, refused", [("global", True), ("thread_local", False)])
def test_thread_local_mode_lets_other_threads_use_the_default_stream(mode, refused):
    x = torch.ones(4, device=DEVICE)
    errors = []

    def other_thread():
        try:
            x.add_(1)  # this thread's current stream is the default stream
        except RuntimeError as e:
            errors.append(str(e))

    def body():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        return x * 2

    if refused:
        with pytest.raises(RuntimeError, match="work launched on the default stream"):
            _capture(body, capture_error_mode=mode)
        assert errors and "capturing" in errors[0]
    else:
        g, out = _capture(body, capture_error_mode=mode)
        assert not errors
        g.replay()
        assert out.cpu().tolist() == [4.0] * 4


@graphs
def test_graphs_share_a_pool_and_its_memory_lives_as_long_as_they_do(mod):
    x = torch.ones(1 << 18, device=DEVICE)  # 1 MiB
    torch.accelerator.synchronize()
    mod.empty_cache()
    reserved = mod.memory_reserved()
    g1, first = _capture(lambda: (x + 1) * 2)  # (x + 1) is freed inside the capture: the pool keeps it
    g2, b = _capture(lambda: first - 1, pool=g1.pool())
    assert g2.pool() == g1.pool()
    handle = mod.graph_pool_handle()
    g3, c = _capture(lambda: x * 5, pool=handle)
    assert g3.pool() == handle != g1.pool()
    mod.empty_cache()
    assert mod.memory_reserved() > reserved  # live pools are not given back
    x.fill_(2)
    g1.replay()
    g2.replay()
    g3.replay()
    assert b.cpu()[:2].tolist() == [5.0, 5.0] and c.cpu()[:2].tolist() == [10.0, 10.0]
    first = b = c = None  # the graphs' outputs go too
    for g in (g1, g2, g3):
        g.reset()
    mod.empty_cache()
    assert mod.memory_reserved() <= reserved


@graphs
def test_random_ops_draw_fresh_numbers_on_every_replay_and_follow_manual_seed(mod):
    g, (r, d) = _capture(lambda: (torch.rand(64, device=DEVICE), torch.nn.functional.dropout(torch.ones(64, device=DEVICE), 0.5)))
    torch.manual_seed(3)
    replayed = []
    for _ in range(3):
        g.replay()
        replayed.append((r.cpu().clone(), d.cpu().clone()))
    state_after_replays = mod.get_rng_state()
    assert not torch.equal(replayed[0][0], replayed[1][0]) and not torch.equal(replayed[1][0], replayed[2][0])
    torch.manual_seed(3)
    eager = [
        (torch.rand(64, device=DEVICE).cpu(), torch.nn.functional.dropout(torch.ones(64, device=DEVICE), 0.5).cpu())
        for _ in range(3)
    ]
    for (r1, d1), (r2, d2) in zip(replayed, eager):
        assert torch.equal(r1, r2) and torch.equal(d1, d2)
    assert torch.equal(mod.get_rng_state(), state_after_replays)


@graphs
def test_reset_and_capture_again(mod):
    x = torch.full((4,), 3.0, device=DEVICE)
    g, out = _capture(lambda: x + 1)
    g.replay()
    assert out.cpu().tolist() == [4.0] * 4
    with pytest.raises(RuntimeError, match="reset"), _side_stream(), g:
        pass
    g.reset()
    with pytest.raises(RuntimeError, match="no capture"):
        g.replay()
    with _side_stream(), g:
        out = x * 10
    g.replay()
    assert out.cpu().tolist() == [30.0] * 4


@graphs
def test_keep_graph_instantiate_and_debug_dump(tmp_path):
    x = torch.ones(4, device=DEVICE)
    g = torch.accelerator.Graph(keep_graph=True)
    with pytest.raises(RuntimeError, match="enable_debug_mode"):
        g.debug_dump(str(tmp_path / "no.dot"))
    g.enable_debug_mode()
    with _side_stream(), g:
        out = (x + 1).sin()
    g.instantiate()
    g.replay()
    assert torch.allclose(out.cpu(), torch.full((4,), 2.0).sin())
    g.debug_dump(str(tmp_path / "graph.dot"))
    dump = (tmp_path / "graph.dot").read_text()
    assert dump.startswith("digraph") and "aten::add" in dump and "aten::sin" in dump


@graphs
def test_the_torch_cuda_style_helpers(mod):
    x = torch.ones(4, device=DEVICE)
    assert not mod.is_current_stream_capturing()
    g = torch.accelerator.Graph()
    seen = []
    with mod.graph(g):
        seen.append(mod.is_current_stream_capturing())
        out = x * 7
    assert seen == [True] and not mod.is_current_stream_capturing()
    assert torch.accelerator.current_stream().stream_id == 0  # the side stream was left
    g.replay()
    assert out.cpu().tolist() == [7.0] * 4


@pytest.mark.skipif("graphs" in CAPABILITIES, reason="the driver has graphs")
def test_a_driver_without_graphs_says_so():
    with pytest.raises(RuntimeError, match="capability 'graphs'"), torch.Stream(device=DEVICE), torch.accelerator.Graph():
        pass


@graphs
def test_make_graphed_callables_trains_as_the_eager_modules(mod):
    """The partial-network capture of PyTorch's CUDA-graph notes: three graphed modules, a branch
    on a host read between them, trained as their eager copies."""
    torch.manual_seed(0)
    modules = [torch.nn.Linear(8, 12), torch.nn.Linear(12, 4), torch.nn.Linear(12, 4)]
    graphed = [m.to(DEVICE) for m in modules]
    eager = [copy.deepcopy(m) for m in graphed]
    x = torch.randn(16, 8, device=DEVICE)
    h = torch.randn(16, 12, device=DEVICE, requires_grad=True)
    graphed = [mod.make_graphed_callables(m, (args,)) for m, args in zip(graphed, (x, h, h))]
    data = [(torch.randn(16, 8, device=DEVICE), torch.randn(16, 4, device=DEVICE)) for _ in range(5)]

    def train(m1, m2, m3):
        opt = torch.optim.SGD([p for m in (m1, m2, m3) for p in m.parameters()], lr=0.1)
        losses = []
        for inp, target in data:
            opt.zero_grad(set_to_none=True)
            tmp = m1(inp)
            tmp = m2(tmp) if tmp.sum().item() > 0 else m3(tmp)
            loss = torch.nn.functional.mse_loss(tmp, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert train(*graphed) == pytest.approx(train(*eager), rel=1e-5)
    for g, e in zip(graphed, eager):
        for p, q in zip(g.parameters(), e.parameters()):
            torch.testing.assert_close(p.cpu(), q.cpu())


@graphs
def test_make_graphed_callables_of_functions_sharing_a_pool(mod):
    def f(a, b):
        return (a * b).sin(), a + b

    a, b = (torch.randn(5, device=DEVICE, requires_grad=True) for _ in range(2))
    graphed_f, graphed_linear = mod.make_graphed_callables((f, torch.nn.Linear(5, 5).to(DEVICE)), ((a, b), (a,)))
    a2, b2 = (torch.randn(5, device=DEVICE, requires_grad=True) for _ in range(2))
    u, v = graphed_f(a2, b2)
    (u.sum() + v.sum()).backward()
    a3, b3 = (t.detach().clone().requires_grad_() for t in (a2, b2))
    u3, v3 = f(a3, b3)
    (u3.sum() + v3.sum()).backward()
    torch.testing.assert_close(u.cpu(), u3.cpu())
    torch.testing.assert_close(a2.grad.cpu(), a3.grad.cpu())
    torch.testing.assert_close(b2.grad.cpu(), b3.grad.cpu())
    assert graphed_linear(a2).shape == (5,)
