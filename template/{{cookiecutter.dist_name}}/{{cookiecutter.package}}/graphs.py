"""Graph capture and replay on {{ cookiecutter.device }}: the torch.cuda names of CUDA graphs, over
PyTorch's device-generic `torch.accelerator.Graph` (which csrc/runtime/graphs.cpp implements).

`torch.accelerator.Graph` is the graph itself; `graph(g)` captures into it on a side stream, as
`torch.cuda.graph` does; `graph_pool_handle()` names a memory pool several graphs share;
`is_current_stream_capturing()` tells whether work launched now is recorded;
`make_graphed_callables` turns modules or functions into graphed ones (a forward graph and a
backward graph in one autograd node), as `torch.cuda.make_graphed_callables`. A driver without the
`graphs` capability (driver.h) makes a capture raise, naming it. `torch.compile(mode=
"reduce-overhead")` does not use these graphs: Inductor's cudagraph trees are CUDA-only in torch
(docs/porting.md, "What the graphs calls must guarantee", says where). What a hardware team
replaces: nothing here.
"""

from __future__ import annotations

import itertools
import threading

import torch
from torch.utils import _pytree

from {{ cookiecutter.package }}._utils import device_index as _index

Graph = torch.accelerator.Graph

_pool_ids = itertools.count(1)
_pool_lock = threading.Lock()
_capture_streams: dict[int, torch.Stream] = {}


def graph_pool_handle() -> tuple[int, int]:
    """A memory pool id to pass as `pool=` to several graphs, so they share one pool (the
    graphs' own pools are (n, 0); these are (0, n), as torch.cuda.graph_pool_handle's)."""
    with _pool_lock:
        return (0, next(_pool_ids))


def is_current_stream_capturing(device=None) -> bool:
    """Whether the current stream of `device` records into a graph (work launched now is
    captured, not run)."""
    return torch.accelerator.current_stream(_index(device)).is_capturing()


class graph:
    """Captures the work of the block into `g` (a torch.accelerator.Graph) on `stream` — by
    default a side stream kept for captures, as torch.cuda.graph — with the memory pool `pool`
    and the capture error mode `capture_error_mode` ("global", "thread_local" or "relaxed")."""

    def __init__(self, g: torch.accelerator.Graph, pool=None, stream: torch.Stream | None = None,
                 capture_error_mode: str = "global"):
        self.g = g
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self.stream = stream
        self._previous: torch.Stream | None = None

    def __enter__(self):
        torch.accelerator.synchronize()
        torch.accelerator.empty_cache()
        device = torch.accelerator.current_device_index()
        stream = self.stream if self.stream is not None else _capture_stream(device)
        self._previous = torch.accelerator.current_stream(stream.device_index)
        torch.accelerator.set_stream(stream)
        self.g.graph_pool = self.pool
        self.g.capture_error_mode = self.capture_error_mode
        try:
            self.g.capture_begin()
        except BaseException:
            torch.accelerator.set_stream(self._previous)
            raise
        return self.g

    def __exit__(self, *exc_info):
        try:
            self.g.capture_end()
        finally:
            torch.accelerator.set_stream(self._previous)


def _capture_stream(device: int) -> torch.Stream:
    with _pool_lock:
        if device not in _capture_streams:
            _capture_streams[device] = torch.Stream(device=torch.device("{{ cookiecutter.device }}", device))
        return _capture_streams[device]


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """Graphed versions of `callables` (a module or function, or a tuple of them run in that order),
    as torch.cuda.make_graphed_callables: each runs its forward as one replayed graph inside an
    autograd node whose backward replays a graph of the backward. `sample_args` gives each one's
    tensor arguments (a tuple, or a tuple of tuples); later calls must pass tensors of the same
    shapes, dtypes and requires_grad. The graphs share one memory pool (`pool`, or a new one)."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    for c in callables:
        if isinstance(c, torch.nn.Module) and (c._forward_hooks or c._forward_pre_hooks or c._backward_hooks):
            raise RuntimeError("make_graphed_callables: modules with hooks cannot be graphed (their hooks would not run)")
    parts = [_GraphedPart(c, args, allow_unused_input) for c, args in zip(callables, sample_args)]
    torch.accelerator.synchronize()
    side = torch.Stream(device=torch.device("{{ cookiecutter.device }}", torch.accelerator.current_device_index()))
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        for part in parts:
            for _ in range(num_warmup_iters):
                part.run_eagerly()
    torch.accelerator.current_stream().wait_stream(side)
    torch.accelerator.synchronize()
    pool = pool if pool is not None else graph_pool_handle()
    for part in parts:  # the forward graphs in the order the callables run, the backward ones reversed
        part.capture_forward(pool, side)
    for part in reversed(parts):
        part.capture_backward(pool, side)
    graphed = tuple(part.graphed() for part in parts)
    return graphed[0] if single else graphed


class _GraphedPart:
    """One callable of make_graphed_callables: its static inputs, outputs and gradients, its graphs."""

    def __init__(self, fn, sample_args, allow_unused_input: bool):
        self.fn = fn
        flat, _ = _pytree.tree_flatten(sample_args)
        if not all(isinstance(a, torch.Tensor) for a in flat):
            raise TypeError("make_graphed_callables: sample_args must hold tensors only")
        self.args = tuple(sample_args)
        self.params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
        self.inputs = tuple(flat) + self.params  # static: every call copies its arguments into these
        self.allow_unused = allow_unused_input
        self.training = fn.training if isinstance(fn, torch.nn.Module) else None

    def _grads(self, outputs, grad_outputs):
        wanted = tuple(i for i in self.inputs if i.requires_grad)
        differentiable = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        if not wanted or not differentiable:
            return ()
        return torch.autograd.grad(
            tuple(o for o, _ in differentiable), wanted, grad_outputs=tuple(g for _, g in differentiable),
            only_inputs=True, allow_unused=self.allow_unused,
        )

    def run_eagerly(self):
        outputs, _ = _pytree.tree_flatten(self.fn(*self.args))
        self._grads(outputs, [torch.empty_like(o) for o in outputs])

    def capture_forward(self, pool, side):
        self.fwd = torch.accelerator.Graph()
        with graph(self.fwd, pool=pool, stream=side):
            out = self.fn(*self.args)
        flat, self.out_spec = _pytree.tree_flatten(out)
        self.outputs = tuple(flat)

    def capture_backward(self, pool, side):
        self.grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in self.outputs)
        self.bwd = torch.accelerator.Graph()
        with graph(self.bwd, pool=pool, stream=side):
            grads = self._grads(self.outputs, self.grad_outputs)
        it = iter(grads)
        self.grad_inputs = tuple(next(it) if i.requires_grad else None for i in self.inputs)

    def graphed(self):
        part = self

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                for static, given in zip(part.inputs, inputs):
                    if static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                part.fwd.replay()
                return tuple(o.detach() for o in part.outputs)

            @staticmethod
            def backward(ctx, *grads):
                for static, given in zip(part.grad_outputs, grads):
                    if static is not None and given is not None and static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                part.bwd.replay()
                return tuple(g.detach() if g is not None else None for g in part.grad_inputs)

        def run(*user_args):
            flat, _ = _pytree.tree_flatten(user_args)
            out = Graphed.apply(*(tuple(flat) + part.params))
            return _pytree.tree_unflatten(list(out), part.out_spec)

        if not isinstance(self.fn, torch.nn.Module):
            return run
        module, eager_forward = self.fn, self.fn.forward

        def forward(*user_args):  # graphed in the training mode it was captured in, eager otherwise
            return run(*user_args) if module.training == part.training else eager_forward(*user_args)

        module.forward = forward
        return module
