"""Operator resolution comes from the installed torch's torchgen, not from a table of ours."""

import json

import pytest

from backendgen.plumbing.errors import UnknownOpError, UserError
from backendgen.torchdb.opdb import ReturnKind, load_opdb, torch_info


@pytest.fixture(scope="module")
def db():
    return load_opdb()


def test_matches_the_live_dispatcher(db):
    """Every schema we derive is the one the installed torch's dispatcher has (canonicalised)."""
    import torch

    names = ["mul.out", "topk.values", "native_layer_norm", "convolution_backward", "index.Tensor", "empty_strided"]
    for n in names:
        op = db.resolve(n)
        packet = getattr(torch.ops.aten, op.base)
        live = getattr(packet, op.overload or "default")._schema
        assert str(torch._C.parse_schema(op.qualified_schema)) == str(live), n


def test_the_required_set_is_the_dispatch_true_default_false_set(db):
    required = {op.name for op in db.required()}
    assert "mul.out" in required and "empty_strided" in required
    assert "mul.Tensor" not in required  # a structured default runs it through mul.out
    assert "linear" not in required  # CompositeImplicitAutograd
    assert len(required) > 500


@pytest.mark.parametrize("spelling", ["aten::mul.Tensor", "mul.Tensor", "mul", " mul.Tensor "])
def test_spellings_resolve(db, spelling):
    assert db.resolve(spelling).name == "mul.Tensor"


def test_default_overload(db):
    assert db.resolve("aten::sin").name == "sin"
    assert db.resolve("sin.default").name == "sin"


def test_signature_is_the_symint_dispatcher_signature(db):
    op = db.resolve("empty_strided")
    assert op.signature.startswith("at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride")


@pytest.mark.parametrize(
    "name, match",
    [
        ("mul.Tensr", "did you mean mul.Tensor"),
        ("mull.Tensor", "did you mean mul.Tensor"),
        ("aten::", "malformed"),
        ("mul..Tensor", "malformed"),
        ("x" * 10_000, "too long"),
        ("", "empty"),
        ("softmax", "no default overload"),
    ],
)
def test_bad_op_names(db, name, match):
    with pytest.raises((UnknownOpError, UserError), match=match):
        db.resolve(name)


def test_cache_is_keyed_by_version_and_hash_and_survives_corruption(tmp_path, monkeypatch):
    import backendgen.torchdb.opdb as opdb

    monkeypatch.setenv("BACKENDGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(opdb, "_MEMO", {})
    info = torch_info()
    first = opdb.load_opdb(info)
    files = list(tmp_path.glob("opdb-*.json"))
    assert len(files) == 1 and info.yaml_sha256[:16] in files[0].name
    files[0].write_text("{not json")
    monkeypatch.setattr(opdb, "_MEMO", {})
    again = opdb.load_opdb(info)
    assert len(again) == len(first)
    assert json.loads(files[0].read_text())["sha256"] == info.yaml_sha256


# The fused RNN cells have CUDA kernels only: the CPU fallback has nothing to run for them.
CUDA_ONLY = [
    "_thnn_fused_lstm_cell",
    "_thnn_fused_lstm_cell_backward_impl",
    "_thnn_fused_gru_cell",
    "_thnn_fused_gru_cell_backward",
    "cudnn_convolution",
]


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_operators_without_a_cpu_kernel_are_known_from_the_yaml(db, name):
    op = db.resolve(name)
    assert op.lacks_cpu_kernel and "CPU" not in op.dispatch_keys
    assert db.missing_cpu_kernel(op) is op


@pytest.mark.parametrize(
    "name",
    [
        "sin",
        "sin.out",
        "mul.out",
        "empty_strided",
        "convolution_overrideable",
        "_thnn_fused_lstm_cell_backward",
        "linear",
        "_thnn_fused_lstm_cell.out",
    ],
)
def test_operators_the_cpu_can_run_or_decompose_do_not_lack_one(db, name):
    assert not db.resolve(name).lacks_cpu_kernel


def test_an_autogen_out_overload_needs_its_functional(db):
    """`_thnn_fused_lstm_cell.out` has a composite kernel, but it calls the functional, which has no CPU kernel."""
    out = db.resolve("_thnn_fused_lstm_cell.out")
    assert out.composite_explicit and db.missing_cpu_kernel(out) is db.resolve("_thnn_fused_lstm_cell")
    assert db.missing_cpu_kernel(db.resolve("mul.out")) is None
    assert db.missing_cpu_kernel(db.resolve("add.Scalar_out")) is None  # composite, its functional runs on the CPU


def test_lacking_a_cpu_kernel_agrees_with_the_live_dispatcher(db):
    """What the yaml says is what a clean torch's dispatcher has: no CPU kernel for any flagged operator."""
    import torch

    flagged = [op for op in db.all() if op.lacks_cpu_kernel]
    assert {f"aten::{n}" for n in CUDA_ONLY} <= {op.qualified for op in flagged}
    for op in flagged:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.qualified, "CPU"), op.qualified
    for name in ("mul.out", "sin.out", "empty_strided"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"), name


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("add.Tensor", ReturnKind.TENSOR),
        ("add_.Tensor", ReturnKind.TENSOR_REF),
        ("add.out", ReturnKind.TENSOR_REF),
        ("max.dim", ReturnKind.TUPLE_OF_TENSORS),
        ("max.dim_max", ReturnKind.TUPLE_OF_REFS),
        ("unbind.int", ReturnKind.TENSOR_LIST),
        ("_foreach_add_.Scalar", ReturnKind.NONE),
        ("_local_scalar_dense", ReturnKind.VALUE),
        ("_batch_norm_impl_index", ReturnKind.TUPLE),
        ("resize_", ReturnKind.OTHER_TENSOR),
    ],
)
def test_an_operator_s_return_has_a_kind(db, name, kind):
    assert db.resolve(name).return_kind is kind


def test_return_kinds_agree_with_the_cpp_return_types(db):
    """The kinds come from torchgen's model, not from the C++ spelling; every operator's kind says what its
    spelling says (the generators branch on the kind and spell the type)."""

    def spelled(items):
        one = {
            ReturnKind.TENSOR: "at::Tensor",
            ReturnKind.TENSOR_REF: "at::Tensor &",
            ReturnKind.TENSOR_LIST: "::std::vector<at::Tensor>",
        }
        return [one.get(k) for k in items]

    for op in db.all():
        kind, cpp = op.return_kind, op.returns_cpp
        if kind is ReturnKind.NONE:
            assert cpp == "void" and not op.returns, op.name
        elif len(op.return_items) == 1:
            assert kind is op.return_items[0], op.name
            assert cpp == (spelled([kind])[0] or cpp), op.name
            assert ("Tensor" in cpp) == (kind is not ReturnKind.VALUE), op.name
        else:
            assert cpp.startswith("::std::tuple<") and len(op.return_items) == len(op.returns), op.name
            if kind in (ReturnKind.TUPLE_OF_TENSORS, ReturnKind.TUPLE_OF_REFS):
                assert cpp == f"::std::tuple<{','.join(spelled(op.return_items))}>", op.name
