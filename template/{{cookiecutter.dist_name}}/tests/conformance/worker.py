"""The worker side of the conformance suite: runs one OpInfo at a time, on the CPU and on the
{{ cookiecutter.device }} device, and compares the two.

A worker is started by the supervisor (runner.py) as `python -m tests.conformance.runner --worker`;
it reads jobs (one JSON object per line) on stdin and answers with JSON lines on its own copy of
stdout (fd 1 itself goes to the worker's log, so whatever an operator prints cannot garble the
protocol). It dies with the operator when one aborts: the supervisor records the crash and
carries on with a fresh worker.

What is compared, for every sample, device against CPU:
- forward: the outputs (values, sizes, strides, and whether an output aliases an input), on the
  sample as given and on `sample.noncontiguous()`;
- backward: the gradients of the outputs with respect to every input that requires grad;
- inplace: the in-place variant on non-contiguous inputs (`sample.noncontiguous()`, whose tensors
  are views with a storage offset) and on a column-major view with a storage offset;
- out: out= into non-contiguous outputs, views with a storage offset and non-trivial strides into
  a larger buffer whose other elements hold a sentinel;
and, after every call, every input and out= tensor WHOLE: the full contents of its storage
(elements outside the view included), its sizes, strides and storage offset. The device's inputs
mirror the CPU's exactly (same storages, sizes, strides, offsets and aliasing between arguments);
random operators draw from generators seeded identically (see `_seeded`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import time
import traceback
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

import {{ cookiecutter.package }}  # noqa: F401  (works with TORCH_DEVICE_BACKEND_AUTOLOAD=0 too)

DEVICE = "{{ cookiecutter.device }}"
VARIANTS = ("forward", "backward", "inplace", "out")
SEED = 20240
OTHER_SEED = 97531  # the CPU generator's seed during the device run: a draw from it cannot pass for the device's


class Unsupported(Exception):
    """A sample this suite cannot mirror (a sparse or nested tensor, say): skipped."""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- mirroring -----------------------------------------------------------------------------------

def _storage_key(t: torch.Tensor):
    try:
        s = t.untyped_storage()
        return (t.device.type, s.data_ptr(), s.nbytes()) if s.nbytes() else ("empty", id(s))
    except (RuntimeError, NotImplementedError):  # e.g. an efficient zero tensor: no storage
        return ("no storage", id(t))


def _is_device(x) -> bool:
    if isinstance(x, torch.device):
        return x.type == DEVICE
    return isinstance(x, str) and (x == DEVICE or x.startswith(DEVICE + ":"))


def mirror(tree, target: str):
    """A copy of `tree` for a run on `target` (the device or "cpu"): every tensor on the device
    is copied to `target`, every CPU tensor stays a CPU tensor (a sample may keep some arguments
    on the CPU on purpose, like tensor_split's indices), and a device named in the arguments
    (factory functions' device=) becomes `target`. Each distinct storage is copied once and every
    tensor rebuilt on its copy at the same sizes, strides and storage offset, so geometry and
    aliasing between arguments are the same on both sides (`.to(device)` would make non-dense
    tensors contiguous and drop the aliasing). requires_grad is kept (on a new leaf)."""
    copies = {}

    def one(t):
        if not isinstance(t, torch.Tensor):
            if _is_device(t) and target == "cpu":
                return torch.device("cpu") if isinstance(t, torch.device) else "cpu"
            return t
        if t.layout != torch.strided or t.is_nested or t.is_quantized or t.device.type not in (DEVICE, "cpu"):
            raise Unsupported(f"a {t.layout} tensor on {t.device}")
        if t.is_conj():
            return one(t.conj()).conj()
        if t.is_neg():
            return one(t._neg_view())._neg_view()
        if t._is_zerotensor():
            return torch.zeros_like(t, device=target if t.device.type == DEVICE else "cpu")
        dest = target if t.device.type == DEVICE else "cpu"
        key = _storage_key(t)
        if key not in copies:
            raw = torch.empty(0, dtype=torch.uint8, device=t.device)
            with torch.no_grad():
                raw.set_(t.untyped_storage())
            copies[key] = raw.to(dest, copy=True).untyped_storage()
        out = torch.empty(0, dtype=t.dtype, device=dest)
        with torch.no_grad():
            out.set_(copies[key], t.storage_offset(), t.size(), t.stride())
        if t.requires_grad:
            out.requires_grad_(True)
        return out

    return tree_map(one, tree)


def mentions_device(tree) -> bool:
    return any((isinstance(x, torch.Tensor) and x.device.type == DEVICE) or _is_device(x) for x in tree_flatten(tree)[0])


def embedded(t: torch.Tensor, *, column_major: bool, step: int, offset: int, device=None) -> torch.Tensor:
    """A view holding `t`'s values inside a larger buffer (on `device`, default t's): storage
    offset `offset`, every `step`-th element along the fastest dimension, dimensions laid out
    column-major if asked; the buffer's other elements hold a sentinel of the dtype."""
    sizes = list(t.shape)
    order = list(range(len(sizes)))
    if not column_major:
        order.reverse()
    strides = [0] * len(sizes)
    stride = step
    for d in order:
        strides[d] = stride
        stride *= max(sizes[d], 1)
    span = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if t.numel() else offset
    with torch.no_grad():
        buf = torch.full((span + step,), sentinel(t.dtype), dtype=t.dtype, device=device or t.device)
        view = buf.as_strided(sizes, strides, offset)
        view.copy_(t)
    return view


def sentinel(dtype):
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return -7.25
    return 77


# --- comparing -----------------------------------------------------------------------------------

def _whole(t: torch.Tensor) -> torch.Tensor:
    """Every element of `t`'s storage, as `t`'s dtype (on the CPU)."""
    storage = t.untyped_storage()
    size = t.element_size()
    whole_elements = storage.nbytes() % size == 0
    full = torch.empty(0, dtype=t.dtype if whole_elements else torch.uint8, device=t.device)
    with torch.no_grad():
        if whole_elements:
            full.set_(storage, 0, (storage.nbytes() // size,), (1,))
        else:
            full.set_(storage)
    return full.detach().cpu()


def _geometry(t: torch.Tensor):
    return tuple(t.shape), _strides(t), t.storage_offset()


def _strides(t: torch.Tensor):
    # strides of dimensions of size 1 (or of an empty tensor) do not locate any element
    if t.numel() == 0:
        return None
    return tuple(st for s, st in zip(t.shape, t.stride()) if s > 1)


def _values_differ(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_stride=False, check_device=False)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return _one_line("; ".join(lines[:3]))
    return None


class Mismatch(Exception):
    pass


def compare_outputs(dev, cpu, what: str, cpu_inputs, dev_inputs, *, on_device: bool, strides: bool = True,
                    values: bool = True) -> None:
    """Raise Mismatch if the device's outputs differ from the CPU's: structure, dtype, sizes,
    strides, values (unless `values` is False: uninitialized memory), the device (the device's
    if `on_device`), and aliasing of the inputs."""
    d_leaves, d_spec = tree_flatten(dev)
    c_leaves, c_spec = tree_flatten(cpu)
    if len(d_leaves) != len(c_leaves):
        raise Mismatch(f"{what}: {len(d_leaves)} outputs on the device, {len(c_leaves)} on the CPU")
    in_keys = {}
    for c, d in zip(_tensors(cpu_inputs), _tensors(dev_inputs)):
        in_keys.setdefault(_storage_key(c), _storage_key(d))
    for i, (d, c) in enumerate(zip(d_leaves, c_leaves)):
        name = f"{what}[{i}]" if len(c_leaves) > 1 else what
        if isinstance(c, torch.Tensor) != isinstance(d, torch.Tensor):
            raise Mismatch(f"{name}: {type(d).__name__} on the device, {type(c).__name__} on the CPU")
        if not isinstance(c, torch.Tensor):
            if c != d and not (c != c and d != d):  # NaN == NaN here
                raise Mismatch(f"{name}: {d!r} on the device, {c!r} on the CPU")
            continue
        if on_device and c.device.type == "cpu" and d.device.type != DEVICE:
            raise Mismatch(f"{name}: the device returned a tensor on {d.device}")
        if d.dtype != c.dtype or d.shape != c.shape:
            raise Mismatch(f"{name}: {d.dtype}{list(d.shape)} on the device, {c.dtype}{list(c.shape)} on the CPU")
        if c.layout != torch.strided:
            continue
        if strides and _strides(d) != _strides(c):
            raise Mismatch(f"{name}: strides {d.stride()} on the device, {c.stride()} on the CPU")
        aliased = in_keys.get(_storage_key(c))
        if aliased is not None and c.numel():
            if _storage_key(d) != aliased:
                raise Mismatch(f"{name}: the CPU's output is a view of an input, the device's is not")
            if d.storage_offset() != c.storage_offset():
                raise Mismatch(f"{name}: storage offset {d.storage_offset()} on the device, {c.storage_offset()} on the CPU")
        diff = values and _values_differ(d.detach().cpu(), c.detach())
        if diff:
            raise Mismatch(f"{name}: values differ: {diff}")


def compare_arguments(dev_tree, cpu_tree, what: str) -> None:
    """Raise Mismatch unless every tensor argument is the same on both sides after the call:
    sizes, strides, storage offset and the whole storage's contents."""
    for i, (d, c) in enumerate(zip(_tensors(dev_tree), _tensors(cpu_tree))):
        if _geometry(d) != _geometry(c):
            raise Mismatch(
                f"{what} argument {i}: sizes/strides/offset {list(d.shape)}/{d.stride()}/{d.storage_offset()} "
                f"on the device, {list(c.shape)}/{c.stride()}/{c.storage_offset()} on the CPU"
            )
        diff = _values_differ(_whole(d), _whole(c))
        if diff:
            raise Mismatch(f"{what} argument {i}: storage contents differ (the view or around it): {diff}")


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


# --- running -------------------------------------------------------------------------------------

def _seeded(fn, device_run: bool):
    """Run `fn` with the generators seeded: the CPU's with SEED for the CPU run; for the device
    run the device's with SEED and the CPU's with another seed, so a random operator on the
    device must draw from the device's generator to draw what the CPU drew. Many random OpInfos
    seed for themselves (`torch.manual_seed(42)`, which seeds every generator alike): during the
    device run `torch.manual_seed` keeps that asymmetry too."""
    torch.default_generator.manual_seed(OTHER_SEED if device_run else SEED)
    getattr(torch, DEVICE).manual_seed(SEED)
    real_manual_seed = torch.manual_seed
    if device_run:
        def manual_seed(seed):
            getattr(torch, DEVICE).manual_seed(int(seed))
            return torch.default_generator.manual_seed(int(seed) + OTHER_SEED)
        torch.manual_seed = manual_seed
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
    finally:
        torch.manual_seed = real_manual_seed
    return result, {_one_line(w.message, 200) for w in caught}


class Outcome:
    """Per-(op, variant) tally over samples."""

    def __init__(self):
        self.counts = {"pass": 0, "mismatch": 0, "error": 0, "skipped": 0}
        self.first = None  # the first failure's description
        self.skip_reason = None

    def add(self, status: str, detail: str | None = None):
        self.counts[status] += 1
        if status in ("mismatch", "error") and self.first is None:
            self.first = detail
        if status == "skipped" and self.skip_reason is None:
            self.skip_reason = detail

    @property
    def status(self) -> str:
        for s in ("mismatch", "error", "pass"):
            if self.counts[s]:
                return s
        return "skipped"


def run_case(call, tree, outcome: Outcome, label: str, *, strides=True, values=True) -> None:
    """Run `call(args)` on a CPU copy and on a device copy of `tree` (see `mirror`) and compare."""
    try:
        cpu_args = mirror(tree, "cpu")
        dev_args = mirror(tree, DEVICE)
    except Unsupported as e:
        outcome.add("skipped", f"{label}: {e}")
        return
    try:
        cpu_out, cpu_warn = _seeded(lambda: call(cpu_args), device_run=False)
    except _NoGrad:
        outcome.add("skipped", f"{label}: no output requires grad")
        return
    except Exception as e:
        outcome.add("skipped", f"{label}: the CPU raises {type(e).__name__}")
        return
    try:
        dev_out, dev_warn = _seeded(lambda: call(dev_args), device_run=True)
    except Exception as e:
        outcome.add("error", f"{label}: the device raised {type(e).__name__}: {_one_line(e, 240)}")
        return
    try:
        compare_outputs(dev_out, cpu_out, f"{label}: output", cpu_args, dev_args, on_device=mentions_device(tree),
                        strides=strides, values=values)
        compare_arguments(dev_args, cpu_args, f"{label}:")
        extra = sorted(w for w in dev_warn - cpu_warn if "fallback" not in w.lower())
        if extra:
            raise Mismatch(f"{label}: the device warned where the CPU did not: {extra[0]}")
    except Mismatch as e:
        outcome.add("mismatch", str(e))
        return
    except Exception as e:  # comparing needed an operator the device does not have
        outcome.add("error", f"{label}: comparing the results raised {type(e).__name__}: {_one_line(e, 240)}")
        return
    outcome.add("pass")


def _sample_tree(s):
    return (s.input, tuple(s.args), dict(s.kwargs))


def _samples(info, dtype, n, requires_grad=False):
    """The OpInfo's first `n` samples, made for the device as PyTorch's device tests make them
    (arguments a sample keeps on the CPU stay there)."""
    try:
        return list(itertools.islice(info.sample_inputs(DEVICE, dtype, requires_grad=requires_grad), n))
    except Exception as e:
        raise Unsupported(f"its samples cannot be made: {type(e).__name__}: {_one_line(e, 120)}") from None


_NOT_COMPARABLE = re.compile(r"Expected: (\w+) is not comparable$")


def values_comparable(info) -> bool:
    """False for the ops whose values PyTorch's own tests do not compare (empty, empty_like, ...:
    uninitialized memory), which say so in a skip decorator."""
    for deco in list(info.decorators or ()) + list(getattr(info, "skips", ()) or ()):
        for fn in getattr(deco, "decorators", [deco]):
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    m = _NOT_COMPARABLE.match(cell.cell_contents) if isinstance(cell.cell_contents, str) else None
                except ValueError:
                    continue
                if m and info.name.startswith(m.group(1)):
                    return False
    return True


def variant_forward(info, dtype, n, outcome):
    values = values_comparable(info)

    def call(tree):
        inp, args, kwargs = tree
        return info(inp, *args, **kwargs)

    for i, s in enumerate(_samples(info, dtype, n)):
        run_case(call, _sample_tree(s), outcome, f"sample {i}", values=values)
        try:
            nc = s.noncontiguous()
        except Exception:
            continue
        run_case(call, _sample_tree(nc), outcome, f"sample {i} non-contiguous", values=values)


def variant_inplace(info, dtype, n, outcome):
    op = info.inplace_variant
    if op is None:
        outcome.add("skipped", "no in-place variant")
        return

    def call(tree):
        inp, args, kwargs = tree
        return op(inp, *args, **kwargs)

    for i, s in enumerate(_samples(info, dtype, n)):
        if not isinstance(s.input, torch.Tensor):
            continue
        try:
            nc = s.noncontiguous()
        except Exception:
            nc = None
        if nc is not None:
            run_case(call, _sample_tree(nc), outcome, f"sample {i} non-contiguous (offset {nc.input.storage_offset()})")
        with torch.no_grad():
            view = embedded(s.input, column_major=True, step=2, offset=3).requires_grad_(s.input.requires_grad)
        run_case(call, (view, tuple(s.args), dict(s.kwargs)), outcome, f"sample {i} column-major view at offset 3")


def variant_out(info, dtype, n, outcome):
    if not info.supports_out:
        outcome.add("skipped", "no out= variant")
        return
    for i, s in enumerate(_samples(info, dtype, n)):
        inp, args, kwargs = _sample_tree(s)
        try:
            torch.manual_seed(SEED)
            with torch.no_grad():
                expected = info(*mirror((inp, *args), "cpu"), **mirror(kwargs, "cpu"))
        except Exception as e:
            outcome.add("skipped", f"sample {i}: the CPU raises {type(e).__name__}")
            continue
        if isinstance(expected, torch.Tensor):
            results, single = [expected], True
        elif isinstance(expected, (tuple, list)) and expected and all(isinstance(t, torch.Tensor) for t in expected):
            results, single = list(expected), False
        else:
            outcome.add("skipped", f"sample {i}: the op returns {type(expected).__name__}")
            continue
        where = DEVICE if mentions_device((inp, args, kwargs)) else "cpu"
        outs = [embedded(torch.zeros_like(r, memory_format=torch.contiguous_format), column_major=r.dim() > 1,
                         step=2, offset=3, device=where) for r in results]

        def call(tree):
            inp, args, kwargs, outs = tree
            return info(inp, *args, out=outs[0] if single else tuple(outs), **kwargs)

        run_case(call, (inp, tuple(args), dict(kwargs), outs), outcome,
                 f"sample {i} out= strided view at offset 3 in a sentinel-filled buffer")


def variant_backward(info, dtype, n, outcome):
    if not info.supports_autograd or not (dtype.is_floating_point or dtype.is_complex):
        outcome.add("skipped", "no autograd for this op or dtype")
        return
    if dtype not in info.supported_backward_dtypes("cpu"):
        outcome.add("skipped", "no backward for this dtype")
        return
    for i, s in enumerate(_samples(info, dtype, n, requires_grad=True)):
        process = s.output_process_fn_grad
        tree = _sample_tree(s)
        if not any(t.requires_grad for t in _tensors(tree)):
            outcome.add("skipped", f"sample {i}: no input requires grad")
            continue

        def call(tree, process=process):
            inp, args, kwargs = tree
            out = process(info(inp, *args, **kwargs))
            outs = [t for t in _tensors(out) if t.requires_grad]
            wrt = [t for t in _tensors(tree) if t.requires_grad]
            if not outs:
                raise _NoGrad()
            gen = torch.Generator().manual_seed(SEED)
            grads_out = [torch.randn(o.shape, dtype=o.dtype, generator=gen).to(o.device) for o in outs]
            grads = torch.autograd.grad(outs, wrt, grads_out, allow_unused=True)
            return ["no gradient" if g is None else g for g in grads]

        run_case(call, tree, outcome, f"sample {i} gradients", strides=False)


class _NoGrad(Exception):
    pass


RUNNERS = {"forward": variant_forward, "backward": variant_backward, "inplace": variant_inplace, "out": variant_out}


# --- the worker loop -----------------------------------------------------------------------------

def _catalogue(dtypes):
    """What the supervisor needs to plan: each OpInfo's name and the requested dtypes it supports on the CPU."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops = []
    for info in op_db:
        try:
            supported = info.supported_dtypes("cpu")
        except Exception:
            supported = set()
        ops.append({"op": info.full_name, "dtypes": [d for d in dtypes if getattr(torch, d) in supported]})
    return op_db, ops


def run_job(info, dtype_name: str, variants, samples: int, emit) -> None:
    dtype = getattr(torch, dtype_name)
    for variant in variants:
        emit({"event": "start", "variant": variant})
        started = time.monotonic()
        outcome = Outcome()
        try:
            RUNNERS[variant](info, dtype, samples, outcome)
        except Unsupported as e:
            outcome.add("skipped", str(e))
        except Exception as e:  # the suite's own failure on this op: report it, do not hide it
            outcome.add("error", f"the suite failed on this op: {type(e).__name__}: {_one_line(e, 200)} "
                                 f"at {_one_line(traceback.format_exc().splitlines()[-3], 120)}")
        detail = outcome.first if outcome.status in ("mismatch", "error") else outcome.skip_reason
        emit({"event": "result", "op": info.full_name, "dtype": dtype_name, "variant": variant,
              "status": outcome.status, "detail": detail, "samples": outcome.counts,
              "seconds": round(time.monotonic() - started, 3)})


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the operators print goes to the worker's log, not into the protocol
    sys.stdout = sys.stderr
    torch.set_num_threads(1)  # one worker per core

    def emit(obj):
        channel.write(json.dumps(obj) + "\n")
        channel.flush()

    hello = json.loads(sys.stdin.readline())
    bad = [d for d in hello["dtypes"] if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        emit({"event": "hello", "error": f"unknown dtype {bad[0]!r} (use torch's names: float32, int64, ...)"})
        return
    op_db, ops = _catalogue(hello["dtypes"])
    by_name = {info.full_name: info for info in op_db}
    emit({"event": "hello", "ops": ops if hello.get("catalogue") else None})
    for line in sys.stdin:
        job = json.loads(line)
        run_job(by_name[job["op"]], job["dtype"], job["variants"], job["samples"], emit)
        emit({"event": "done"})
