"""The model suite's harness: train the same model on the CPU and on the device and compare.

A run builds the model on the CPU with a fixed seed, copies it (`copy.deepcopy`, so both runs
start from the same weights), moves the copy with `.to(device)` — the way users move models, so
tied weights and buffers go through nn.Module.to() — and trains it for a few steps on inputs made
on the CPU and moved. What is compared after the run, device against CPU: every step's loss and
output, every gradient, the updated parameters and the buffers (batch-norm statistics).
`compiled=True` runs the device side through torch.compile (the CPU reference stays eager).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from tests.conftest import DEVICE


@dataclass
class Run:
    losses: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def _cpu(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.to_dense() if x.layout != torch.strided else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cpu(v) for v in x)
    return x


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    if hasattr(out, "data") and isinstance(out.data, torch.Tensor):  # PackedSequence
        return out.data
    if isinstance(out, Mapping):  # a model output object (Hugging Face's ModelOutput): its first tensor
        return _first_tensor(next(v for v in out.values() if isinstance(v, (torch.Tensor, tuple, list))))
    raise TypeError(f"no tensor in {type(out)}")


def to_device(x, device):
    if isinstance(x, torch.Tensor) or hasattr(x, "to"):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


def train(model: torch.nn.Module, batches, loss_fn, device: str, *, make_opt=None, steps: int | None = None,
          compiled: bool = False, autocast_dtype: torch.dtype | None = None, train_mode: bool = True,
          forward_args: int | None = None) -> Run:
    """Train `model` (already built; deep-copied here) on `device` over `batches` (CPU tensors, a
    list of tuples: the model's arguments, then — with `forward_args` — what only the loss reads).
    `loss_fn(output, batch)` gives the loss; `make_opt(params)` the optimizer."""
    torch.manual_seed(0)  # every run draws the same random numbers (the device's generators are seeded too)
    model = copy.deepcopy(model).to(device)
    model.train(train_mode)
    opt = make_opt(model.parameters()) if make_opt else torch.optim.SGD(model.parameters(), lr=0.05)
    fwd = torch.compile(model, dynamic=False) if compiled else model
    run = Run()
    for batch in batches[:steps] if steps else batches:
        batch = to_device(batch, device)
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is not None:
            with torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype):
                out = fwd(*batch[:forward_args])
                loss = loss_fn(out, batch)
        else:
            out = fwd(*batch[:forward_args])
            loss = loss_fn(out, batch)
        loss.backward()
        run.losses.append(_cpu(loss).float())
        run.outputs.append(_cpu(_first_tensor(out)).float())
        if not run.grads:  # the first step's gradients: before any update has compounded a difference
            run.grads = {n: _cpu(p.grad).float() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
    run.params = {n: _cpu(p).float() for n, p in model.named_parameters()}
    run.buffers = {n: _cpu(b) for n, b in model.named_buffers()}
    return run


def assert_same(dev: Run, ref: Run, *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """The device's run equals the CPU's: each loss, output, gradient, parameter and buffer."""
    assert len(dev.losses) == len(ref.losses)
    for i, (a, b) in enumerate(zip(dev.losses, ref.losses)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"loss of step {i}: {m}")
    for i, (a, b) in enumerate(zip(dev.outputs, ref.outputs)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"output of step {i}: {m}")
    for kind in ("grads", "params", "buffers"):
        a, b = getattr(dev, kind), getattr(ref, kind)
        assert a.keys() == b.keys(), f"{kind}: {sorted(a.keys() ^ b.keys())} differ"
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m, name=name, kind=kind: f"{kind} {name}: {m}")


def compare(model, batches, loss_fn, *, compiled: bool = False, rtol: float = 1e-4, atol: float = 1e-5, **kw) -> Run:
    """Train on the CPU and on the device; assert the runs agree; return the device's run."""
    ref = train(model, batches, loss_fn, "cpu", **kw)
    dev = train(model, batches, loss_fn, DEVICE, compiled=compiled, **kw)
    assert_same(dev, ref, rtol=rtol, atol=atol)
    return dev
