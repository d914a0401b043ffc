"""The autocast table (backendgen.json's "amp", `backendgen amp list`) takes effect under
torch.autocast("{{ cookiecutter.device }}").

For every operator in the table, each OpInfo sample that calls it directly is run on the device
under autocast, and compared with the same call on the CPU, without autocast, on the arguments the
policy says it must see: the autocast dtype for lower_precision_fp (given float32), float32 for fp32
(given bfloat16), the widest floating-point type for promote (given bfloat16 and float32 mixed),
float32 through `dtype=` for fp32_set_opt_dtype (given bfloat16). Results must agree in dtype and value.
"""

import json
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map

from tests.ops import harness

DEVICE = "{{ cookiecutter.device }}"
TABLE = json.loads((Path(__file__).resolve().parents[1] / "backendgen.json").read_text()).get("amp", {})
LOW = torch.bfloat16
MAX_SAMPLES = 4


def _packet(name):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _opinfo_samples(name):
    """(args, kwargs) of OpInfo samples of the operator's base name, float32 CPU tensors (searched
    once, then read from the operator tests' sample cache: harness.cached)."""
    base = name.partition(".")[0]

    def search():
        from torch.testing._internal.common_methods_invocations import op_db

        found = []
        for info in op_db:
            names = {info.name, info.name.rpartition(".")[2], getattr(info, "aten_name", None)}
            if base not in names:
                continue
            try:
                samples = list(info.sample_inputs("cpu", torch.float32))
            except Exception:
                continue
            found += [((s.input, *s.args), dict(s.kwargs)) for s in samples]
        return found

    return harness.cached(("amp", base), search)


def _floating(x):
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _given_and_expected(policy, args, kwargs, op):
    """What the test gives the operator under autocast, and the CPU call that policy implies."""
    if policy == "lower_precision_fp":
        given = (args, kwargs)
        expected = tree_map(lambda t: t.to(LOW) if _floating(t) else t, given)
    elif policy in ("fp32", "fp32_set_opt_dtype"):
        given = tree_map(lambda t: t.to(LOW) if _floating(t) else t, (args, kwargs))
        expected = tree_map(lambda t: t.float() if _floating(t) else t, given)
        names = [a.name for a in op._schema.arguments]
        if policy == "fp32_set_opt_dtype" and "dtype" in names and given[1].get("dtype") is None:
            position = names.index("dtype")
            if len(given[0]) <= position:
                expected = (given[0], {**given[1], "dtype": torch.float32})
    elif policy == "promote":
        first = [True]

        def lower_first(t):
            if _floating(t) and first[0]:
                first[0] = False
                return t.to(LOW)
            return t

        given = tree_map(lower_first, (args, kwargs))
        expected = tree_map(lambda t: t.float() if _floating(t) else t, given)
    else:
        raise AssertionError(f"unknown policy {policy}")
    return given, expected


@pytest.mark.parametrize("name", sorted(TABLE))
def test_policy_takes_effect_under_autocast(name):
    policy = TABLE[name]
    op = _packet(name)
    checked = 0
    for args, kwargs in _opinfo_samples(name):
        if checked == MAX_SAMPLES:
            break
        (g_args, g_kwargs), (e_args, e_kwargs) = _given_and_expected(policy, args, kwargs, op)
        if not any(_floating(t) for t in tree_leaves((g_args, g_kwargs))):
            continue
        try:
            expected = op(*e_args, **e_kwargs)
        except Exception:  # a sample of another overload, or of the Python API's argument order
            continue
        d_args, d_kwargs = tree_map(lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t, (g_args, g_kwargs))
        with torch.autocast(DEVICE, dtype=LOW):
            got = op(*d_args, **d_kwargs)
        for e, g in zip(tree_leaves(expected), tree_leaves(got)):
            if isinstance(e, torch.Tensor):
                assert g.device.type == DEVICE
                assert g.dtype == e.dtype, f"{name} ({policy}) returned {g.dtype} under autocast, expected {e.dtype}"
                torch.testing.assert_close(g.cpu(), e, atol=2e-2, rtol=2e-2, equal_nan=True)
        checked += 1
    if not checked:
        pytest.skip(f"no OpInfo sample calls aten::{name} directly (its Python API takes other arguments)")
