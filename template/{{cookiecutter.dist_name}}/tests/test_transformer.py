"""The fast paths PyTorch takes for a PrivateUse1 device, against the CPU: the Transformer's nested
tensors (csrc/aten/nested.cpp) and scaled dot-product attention's fused backend
(csrc/aten/attention.cpp)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import DEVICE

E, HEADS = 16, 2


def _batch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, E)
    # row 0 complete, row 1 two padded positions, row 2 only its first position
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])
    return x, mask


def _pair(module):
    """`module` in eval mode and a copy of it on the device."""
    module = module.eval()
    return module, copy.deepcopy(module).to(DEVICE)


def _layer(**kw):
    return nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, batch_first=True, **kw)


# ---- the Transformer fast path: nested tensors ------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_fast_path_with_a_padding_mask_matches_cpu(mod, norm_first):
    """eval + no_grad + src_key_padding_mask: the encoder packs the batch into a nested tensor
    (_nested_tensor_from_mask) and runs _transformer_encoder_layer_fwd on it."""
    x, mask = _batch()
    cpu, dev = _pair(nn.TransformerEncoder(_layer(norm_first=norm_first), 2, enable_nested_tensor=not norm_first))
    mod.reset_fallback_counts()
    with torch.no_grad():
        expected = cpu(x, src_key_padding_mask=mask)
        got = dev(x.to(DEVICE), src_key_padding_mask=mask.to(DEVICE))
    assert got.device.type == DEVICE and not got.is_nested
    torch.testing.assert_close(got.cpu(), expected)
    assert "aten::_transformer_encoder_layer_fwd" in mod.fallback_stats()  # the fast path ran
    if not norm_first:  # the encoder nests only post-norm layers
        assert "aten::_nested_tensor_from_mask" in mod.fallback_stats()


def test_encoder_fast_path_without_a_mask_matches_cpu():
    x, _ = _batch()
    cpu, dev = _pair(nn.TransformerEncoder(_layer(), 2))
    with torch.no_grad():
        torch.testing.assert_close(dev(x.to(DEVICE)).cpu(), cpu(x))


def test_encoder_layer_fast_path_matches_cpu():
    x, mask = _batch()
    cpu, dev = _pair(_layer())
    with torch.no_grad():
        torch.testing.assert_close(dev(x.to(DEVICE), src_key_padding_mask=mask.to(DEVICE)).cpu(),
                                   cpu(x, src_key_padding_mask=mask))
        torch.testing.assert_close(dev(x.to(DEVICE)).cpu(), cpu(x))


def test_encoder_trains_as_on_cpu():
    """Training takes the ordinary path (attention through scaled_dot_product_attention)."""
    x, mask = _batch()
    torch.manual_seed(1)
    cpu = nn.TransformerEncoder(_layer(), 2)
    dev = copy.deepcopy(cpu).to(DEVICE)
    expected = cpu(x, src_key_padding_mask=mask)
    got = dev(x.to(DEVICE), src_key_padding_mask=mask.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, msg=name)


def test_decoder_matches_cpu():
    x, mask = _batch()
    memory = torch.randn(3, 4, E)
    cpu, dev = _pair(nn.TransformerDecoder(nn.TransformerDecoderLayer(E, HEADS, 32, dropout=0.0, batch_first=True), 2))
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: not attended, as the padding mask
    with torch.no_grad():
        expected = cpu(x, memory, tgt_mask=causal, tgt_key_padding_mask=mask)
        got = dev(x.to(DEVICE), memory.to(DEVICE), tgt_mask=causal.to(DEVICE), tgt_key_padding_mask=mask.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("masked", [False, True])
def test_multihead_attention_fast_path_matches_cpu(masked):
    """eval + no_grad + need_weights=False: _native_multi_head_attention (nested with a padding mask)."""
    x, mask = _batch()
    cpu, dev = _pair(nn.MultiheadAttention(E, HEADS, batch_first=True))
    kw_cpu = {"key_padding_mask": mask} if masked else {}
    kw_dev = {"key_padding_mask": mask.to(DEVICE)} if masked else {}
    with torch.no_grad():
        expected, _ = cpu(x, x, x, need_weights=False, **kw_cpu)
        xd = x.to(DEVICE)
        got, _ = dev(xd, xd, xd, need_weights=False, **kw_dev)
    torch.testing.assert_close(got.cpu(), expected)


def _components():
    torch.manual_seed(0)
    return [torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)]


def test_nested_tensor_on_the_device_matches_cpu():
    parts = _components()
    nt = torch.nested.nested_tensor(parts, device=DEVICE)
    assert nt.is_nested and nt.device.type == DEVICE and nt.dim() == 3 and nt.size(0) == 3
    torch.testing.assert_close(nt.to_padded_tensor(0.0).cpu(), torch.nested.nested_tensor(parts).to_padded_tensor(0.0))
    for got, want in zip(nt.unbind(), parts):
        assert got.device.type == DEVICE
        torch.testing.assert_close(got.cpu(), want)
    back = nt.cpu()
    assert back.is_nested and back.device.type == "cpu"
    for got, want in zip(back.unbind(), parts):
        torch.testing.assert_close(got, want)
    moved = torch.nested.nested_tensor(parts).to(DEVICE)
    assert moved.device.type == DEVICE
    torch.testing.assert_close(moved.to(torch.float64).cpu().to_padded_tensor(0.0),
                               torch.nested.nested_tensor(parts, dtype=torch.float64).to_padded_tensor(0.0))
    # the metadata stays host memory, as on CPU and CUDA
    assert nt._nested_tensor_size().device.type == "cpu"
    assert nt._nested_tensor_size().tolist() == [[2, 3], [4, 3], [1, 3]]


def test_nested_views_stay_views():
    nt = torch.nested.nested_tensor(_components(), device=DEVICE)
    nt.unbind()[1].fill_(7.0)
    assert (nt.cpu().unbind()[1] == 7.0).all()
    nt.transpose(1, 2).unbind()[0].zero_()
    assert (nt.cpu().unbind()[0] == 0.0).all()


def test_nested_operators_forward_and_backward_match_cpu():
    parts = _components()
    weight = torch.randn(5, 3)
    cpu = torch.nested.nested_tensor(parts, requires_grad=True)
    dev = torch.nested.nested_tensor(parts, device=DEVICE, requires_grad=True)
    wc, wd = weight.clone().requires_grad_(), weight.to(DEVICE).requires_grad_()

    def f(nt, w):
        return F.linear(nt * 2 + 1, w).softmax(-1).transpose(1, 2).contiguous().to_padded_tensor(0.0)

    expected, got = f(cpu, wc), f(dev, wd)
    torch.testing.assert_close(got.cpu(), expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), wc.grad)
    for a, b in zip(dev.grad.unbind(), cpu.grad.unbind()):
        torch.testing.assert_close(a.cpu(), b)


# ---- scaled dot-product attention: the overrideable fused backend ---------------------------


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _qkv(kv_heads=4):
    torch.manual_seed(0)
    return torch.randn(2, 4, 5, 8), torch.randn(2, kv_heads, 7, 8), torch.randn(2, kv_heads, 7, 6)


def _dev(*ts):
    return [t.to(DEVICE) for t in ts]


def test_fused_sdp_choice_answers_the_overrideable_backend():
    q, k, v = _dev(*_qkv())
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.1) == SDPBackend.MATH.value  # no dropout in the kernel
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(q, k, v) == SDPBackend.MATH.value
    q3, k3, v3 = (t[0] for t in (q, k, v))  # 3-d inputs: math
    assert torch._fused_sdp_choice(q3, k3, v3) == SDPBackend.MATH.value
    q, k, v = _dev(*_qkv(kv_heads=2))
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.MATH.value
    assert torch._fused_sdp_choice(q, k, v, enable_gqa=True) == SDPBackend.OVERRIDEABLE.value


SDPA_CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
    "bool mask": {"attn_mask": "bool"},
    "float mask": {"attn_mask": "float"},
    "gqa": {"enable_gqa": True, "kv_heads": 2},
    "gqa causal": {"enable_gqa": True, "kv_heads": 1, "is_causal": True},
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_scaled_dot_product_attention_forward_and_backward_match_cpu(case):
    kw = dict(SDPA_CASES[case])
    q, k, v = _qkv(kw.pop("kv_heads", 4))
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to(DEVICE).requires_grad_() for t in (q, k, v)]
    kw_cpu, kw_dev = dict(kw), dict(kw)
    mask = kw.get("attn_mask")
    if mask == "bool":
        m = torch.rand(2, 1, 5, 7) > 0.3
        kw_cpu["attn_mask"], kw_dev["attn_mask"] = m, m.to(DEVICE)
    elif mask == "float":
        m = torch.randn(5, 7)
        kw_cpu["attn_mask"] = m.clone().requires_grad_()
        kw_dev["attn_mask"] = m.to(DEVICE).requires_grad_()
    expected = F.scaled_dot_product_attention(*cpu, **kw_cpu)
    with _OpLog() as log:
        got = F.scaled_dot_product_attention(*dev, **kw_dev)
    assert "aten._scaled_dot_product_fused_attention_overrideable.default" in log.ops
    torch.testing.assert_close(got.cpu(), expected)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    with _OpLog() as log:
        got.backward(grad.to(DEVICE))
    assert "aten._scaled_dot_product_fused_attention_overrideable_backward.default" in log.ops
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad)
    if mask == "float":
        torch.testing.assert_close(kw_dev["attn_mask"].grad.cpu(), kw_cpu["attn_mask"].grad)


def test_scaled_dot_product_attention_with_dropout_runs_on_the_math_backend():
    q, k, v = _dev(*_qkv())
    with _OpLog() as log:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert out.shape == (2, 4, 5, 6) and not any("overrideable" in op for op in log.ops)


def test_overrideable_kernels_return_what_their_schemas_say():
    """As torch_openreg's tests call them: half inputs and a float attn_bias."""
    torch.manual_seed(0)
    shape = (2, 2, 16, 8)
    q, k, v = (torch.rand(shape, dtype=torch.float16) for _ in range(3))
    bias = torch.rand(2, 2, 16, 16, dtype=torch.float16)
    qd, kd, vd, bd = _dev(q, k, v, bias)
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, debug = (
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(qd, kd, vd, attn_bias=bd))
    assert out.shape == shape and out.dtype == torch.float16 and out.device.type == DEVICE
    assert lse.shape == shape[:3] and lse.dtype == torch.float32
    assert (max_q, max_k) == (16, 16)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-3, rtol=2e-3)
    grads = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        torch.ones(shape, dtype=torch.float16).to(DEVICE), qd, kd, vd, bd, [True] * 4, out, lse, cum_q, cum_k,
        max_q, max_k, dropout_p=0.0, is_causal=False, philox_seed=seed, philox_offset=offset)
    assert [tuple(g.shape) for g in grads] == [shape, shape, shape, (2, 2, 16, 16)]
    assert all(g.dtype == torch.float16 and g.device.type == DEVICE for g in grads)
