"""Real architectures, built from torch.nn, trained on the device and on the CPU: the same losses,
outputs, gradients, updated parameters and buffers (tests/models/harness.py).

Operator-by-operator agreement (the conformance suite) does not make a model train right: what
breaks real training lives between operators — tied weights through nn.Module.to(), the fused
RNN cells ATen calls only for accelerators, the Transformer fast path's nested tensors, the
layout a compiled convolution promises, the RNG state activation checkpointing restores. Each
test here is one model a user trains. Opt-in (about two minutes, torch.compile's the most):
`pytest -m models`, or `backendgen test --models`.

What PyTorch itself cannot do for any PrivateUse1 backend is listed in tests/models/conftest.py
(NOT_FOR_PRIVATEUSE1) with the reason, like the conformance suite's expected failures: those
tests are strict expected failures, so a torch that lifts the limitation is noticed.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.conftest import DEVICE
from tests.models.harness import compare, train

pytestmark = pytest.mark.models

def _batches(n, *shapes, dtype=torch.float32, high=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if high is not None:
            out.append(tuple(torch.randint(0, high, s, generator=g) for s in shapes))
        else:
            out.append(tuple(torch.randn(s, generator=g, dtype=dtype) for s in shapes))
    return out


# --- a GPT-style language model with tied embeddings --------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads, self.dropout = heads, dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, ctx=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's lm_head and wte

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(pos))))


def _lm_loss(logits, batch):
    idx = batch[0]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def test_tied_weights_stay_tied_through_to():
    m = TinyGPT().to(DEVICE)
    assert m.head.weight is m.wte.weight
    assert len(list(m.parameters())) == len(list(TinyGPT().parameters()))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_language_model_with_tied_embeddings_adamw(compiled):
    torch.manual_seed(0)
    model = TinyGPT()
    compare(model, _batches(3, (4, 16), high=50), _lm_loss, compiled=compiled,
            # eps well above float noise: attention key biases get gradients that are rounding noise (softmax
            # ignores them), which Adam with a tiny eps would scale up to full steps of either sign
            make_opt=lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-3), rtol=1e-3, atol=1e-4)


# --- a mixture-of-experts layer, routed as Hugging Face's MoE models route on accelerators --------

class MoE(nn.Module):
    def __init__(self, d=16, experts=4, top_k=2):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 32), nn.SiLU(), nn.Linear(32, d)) for _ in range(experts))
        self.top_k = top_k

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(self.top_k, dim=-1)
        # tokens per expert with torch.histc of integer ids: what transformers does on every device
        # but the CPU and MPS (CUDA counts integers; the CPU kernel refuses them)
        ids = chosen.flatten().int() if x.device.type != "cpu" else chosen.flatten().float()
        per_expert = torch.histc(ids, bins=len(self.experts), min=0, max=len(self.experts) - 1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            if int(per_expert[e]) == 0:
                continue
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out


def test_mixture_of_experts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), MoE(), nn.Linear(16, 3))
    compare(model, _batches(3, (12, 8)), lambda out, b: out.pow(2).mean(), make_opt=lambda p: torch.optim.Adam(p, lr=1e-2))


# --- recurrent networks --------------------------------------------------------------------------

class Recurrent(nn.Module):
    def __init__(self, kind, packed=False):
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU}[kind]
        self.rnn = cls(8, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(24, 3)
        self.packed = packed

    def forward(self, x):
        if self.packed:
            lengths = torch.tensor([x.shape[1] - i for i in range(x.shape[0])])
            x = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=True)
            y, _ = self.rnn(x)
            y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True)
        else:
            y, _ = self.rnn(x)
        return self.out(y)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent(kind, packed):
    torch.manual_seed(0)
    compare(Recurrent(kind, packed), _batches(2, (4, 6, 8)), lambda out, b: out.pow(2).mean(),
            make_opt=lambda p: torch.optim.Adam(p, lr=1e-2))


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_recurrent_cells(cell):
    torch.manual_seed(0)

    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = cell(5, 7)

        def forward(self, x):
            h = None
            outs = []
            for t in range(x.shape[1]):
                h = self.cell(x[:, t], h)
                outs.append(h[0] if isinstance(h, tuple) else h)
            return torch.stack(outs, 1)

    compare(Cell(), _batches(2, (3, 4, 5)), lambda out, b: out.sum())


# --- a conv net with batch norm --------------------------------------------------------------------

def _cnn():
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    return nn.Sequential(block(3, 8), block(8, 16), nn.MaxPool2d(2), block(16, 16),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_conv_net_with_batch_norm(compiled):
    torch.manual_seed(0)
    batches = [(x, torch.randint(0, 10, (4,))) for (x,) in _batches(2, (4, 3, 16, 16))]
    compare(_cnn(), batches, lambda out, b: F.cross_entropy(out, b[1]), compiled=compiled,
            make_opt=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), forward_args=1)


def test_compiled_conv_net_inference_in_channels_last_layout():
    # Inductor turns convolution inputs channels_last for inference and asserts the layout the
    # convolution's fake kernel promises
    torch.manual_seed(0)
    model = _cnn().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(copy.deepcopy(model).to(DEVICE))(x.to(DEVICE))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)


# --- Transformer encoder: training, and the eval fast path with a padding mask ---------------------

def _encoder():
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)


def test_transformer_encoder_trains():
    torch.manual_seed(0)
    compare(_encoder(), _batches(2, (3, 5, 16)), lambda out, b: out.pow(2).mean(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
def test_transformer_encoder_eval_fast_path(masked):
    torch.manual_seed(0)
    model = _encoder().eval()
    x = torch.randn(3, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]]) if masked else None
    with torch.no_grad():
        ref = model(x, src_key_padding_mask=mask)
        dev = copy.deepcopy(model).to(DEVICE)(x.to(DEVICE), src_key_padding_mask=None if mask is None else mask.to(DEVICE))
    torch.testing.assert_close(dev.cpu(), ref, rtol=1e-4, atol=1e-5)


def test_multihead_attention_with_masks():
    torch.manual_seed(0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x):
            mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), 1)
            return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]

    compare(Attn(), _batches(2, (2, 6, 16)), lambda out, b: out.sum())


# --- autocast -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_training(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    run = compare(model, _batches(2, (8, 16)), lambda out, b: out.float().pow(2).mean(), autocast_dtype=dtype,
                  rtol=2e-2, atol=2e-2)
    assert run.outputs[0].shape == (8, 4)


def test_autocast_without_a_dtype_uses_the_devices_default():
    with torch.autocast(DEVICE):
        y = nn.Linear(4, 4).to(DEVICE)(torch.randn(2, 4, device=DEVICE))
    assert y.dtype == torch.get_autocast_dtype(DEVICE)


# --- checkpoints ------------------------------------------------------------------------------------

def test_checkpoint_round_trip_resumes_training_exactly():
    torch.manual_seed(0)
    batches = _batches(4, (8, 16))
    loss_fn = lambda out, b: out.pow(2).mean()  # noqa: E731
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    # train 2 steps on the device, save model + optimizer, load into a fresh device model, train 2 more
    m = copy.deepcopy(model).to(DEVICE)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for (x,) in batches[:2]:
        opt.zero_grad()
        loss_fn(m(x.to(DEVICE)), None).backward()
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, map_location=DEVICE)
    assert all(v.device.type == DEVICE for v in state["model"].values())
    m2 = copy.deepcopy(model).to(DEVICE)
    m2.load_state_dict(state["model"])
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    opt2.load_state_dict(state["opt"])
    # the same four steps on the CPU, uninterrupted
    ref = train(model, batches, loss_fn, "cpu", make_opt=lambda p: torch.optim.Adam(p, lr=1e-2))
    for (x,) in batches[2:]:
        opt2.zero_grad()
        loss_fn(m2(x.to(DEVICE)), None).backward()
        opt2.step()
    for name, p in m2.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), ref.params[name], rtol=1e-4, atol=1e-5)
    # and the device checkpoint loads on a CPU-only consumer
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu["model"].values())


# --- activation checkpointing ------------------------------------------------------------------------

class DropoutMLP(nn.Module):
    def __init__(self, checkpointed=None):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.5)) for _ in range(3))
        self.head = nn.Linear(16, 1)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointed is None:
                x = block(x)
            else:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.checkpointed == "reentrant")
        return self.head(x)


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_activation_checkpointing_keeps_dropout_masks(mode):
    torch.manual_seed(0)
    plain = DropoutMLP()
    ckpt = copy.deepcopy(plain)
    ckpt.checkpointed = mode
    x = torch.randn(8, 16, requires_grad=True)
    grads = []
    for model in (plain, ckpt):
        model = model.to(DEVICE)
        torch.manual_seed(1)  # the same masks in both runs, if the recomputation redraws none
        xi = x.detach().to(DEVICE).requires_grad_()
        model(xi).sum().backward()
        grads.append([p.grad.cpu() for p in model.parameters()] + [xi.grad.cpu()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# --- sparse embeddings --------------------------------------------------------------------------------

class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(20, 8, sparse=True)
        self.items = nn.EmbeddingBag(30, 8, mode="mean", sparse=True)
        self.dense = nn.Linear(16, 1)

    def forward(self, user, items):
        return self.dense(torch.cat([self.users(user), self.items(items)], 1)).squeeze(1)


def test_sparse_embedding_recommender_sparse_adam():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 20, (6,), generator=g), torch.randint(0, 30, (6, 4), generator=g)) for _ in range(3)]
    model = Recommender()

    def make_opt(params):
        params = list(params)
        sparse = [p for p in params if p.dim() == 2 and p.shape[1] == 8]
        dense = [p for p in params if all(p is not s for s in sparse)]
        return _Both(torch.optim.SparseAdam(sparse, lr=0.05), torch.optim.Adam(dense, lr=0.05))

    compare(model, batches, lambda out, b: out.pow(2).mean(), make_opt=make_opt)


class _Both:
    """Two optimizers stepped as one (SparseAdam for the embeddings, Adam for the rest)."""

    def __init__(self, *opts):
        self.opts = opts

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()


# --- training-loop idioms -----------------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


@pytest.mark.parametrize("opt", ["sgd-foreach", "adam-foreach", "adamw-fused", "adam-fused", "adagrad", "rmsprop"])
def test_optimizers_foreach_and_fused(opt):
    make = {
        "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
        "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
        "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
        "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
        "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
        "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2),
    }[opt]
    compare(_mlp(), _batches(3, (8, 16)), lambda out, b: out.pow(2).mean(), make_opt=make)


def test_gradient_clipping_and_ema():
    results = []
    for device in ("cpu", DEVICE):
        model = _mlp().to(device)
        ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        norms = []
        for (x,) in _batches(3, (8, 16)):
            opt.zero_grad()
            (model(x.to(device)).pow(2).sum() * 10).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).cpu())
            opt.step()
            ema.update_parameters(model)
        results.append((norms, [p.detach().cpu() for p in ema.module.parameters()]))
    (n_cpu, e_cpu), (n_dev, e_dev) = results
    torch.testing.assert_close(n_dev, n_cpu, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(e_dev, e_cpu, rtol=1e-4, atol=1e-5)


def test_grad_scaler_with_fp16_autocast():
    results = []
    for device in ("cpu", DEVICE):
        model = _mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10)
        for (x,) in _batches(3, (8, 16)):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = model(x.to(device)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        results.append(([p.detach().cpu() for p in model.parameters()], scaler.get_scale()))
    (p_cpu, s_cpu), (p_dev, s_dev) = results
    assert s_dev == s_cpu
    torch.testing.assert_close(p_dev, p_cpu, rtol=2e-2, atol=2e-3)


def test_double_backward_gradient_penalty():
    out = []
    for device in ("cpu", DEVICE):
        model = _mlp().to(device)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2)).to(device).requires_grad_()
        (g,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
        # the last bias has no gradient (dx does not depend on it), on both devices
        out.append([None if p.grad is None else p.grad.cpu() for p in model.parameters()])
    assert [g is None for g in out[1]] == [g is None for g in out[0]]
    out = [[g for g in grads if g is not None] for grads in out]
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-5)


def test_torch_func_per_sample_gradients():
    from torch.func import functional_call, grad, vmap

    out = []
    for device in ("cpu", DEVICE):
        model = _mlp().to(device)
        params = {k: v.detach() for k, v in model.named_parameters()}
        x = torch.randn(5, 16, generator=torch.Generator().manual_seed(4)).to(device)

        def loss(p, xi):
            return functional_call(model, p, (xi.unsqueeze(0),)).pow(2).sum()

        per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
        out.append({k: v.cpu() for k, v in per_sample.items()})
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-5)


def test_pinned_data_loading_non_blocking():
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randn(32, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True, pin_memory_device=DEVICE)
    model = _mlp().to(DEVICE)
    total = 0.0
    for x, y in loader:
        assert x.is_pinned()
        x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
        total += F.mse_loss(model(x), y).item()
    ref = sum(F.mse_loss(_mlp()(x), y).item() for x, y in torch.utils.data.DataLoader(data, batch_size=8))
    assert abs(total - ref) < 1e-4


def test_torch_export_runs_on_the_device():
    model = _mlp().to(DEVICE)
    x = torch.randn(4, 16, device=DEVICE)
    ep = torch.export.export(model, (x,))
    torch.testing.assert_close(ep.module()(x).cpu(), model(x).cpu())


# --- third-party models, when their packages are installed (built from configs: no downloads) ----

def test_huggingface_gpt2_from_config():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    # no dropout: a device's generator need not draw what the CPU's does
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    batches = _batches(2, (2, 12), high=64)
    compare(model, batches, lambda out, b: out.logits.float().pow(2).mean(), forward_args=1,
            make_opt=lambda p: torch.optim.AdamW(p, lr=1e-3), rtol=1e-3, atol=1e-4)


def test_torchvision_resnet18():
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    batches = [(x, torch.randint(0, 10, (2,))) for (x,) in _batches(1, (2, 3, 32, 32))]
    compare(model, batches, lambda out, b: F.cross_entropy(out, b[1]), forward_args=1, rtol=1e-3, atol=1e-4)


def test_timm_vit_from_config():
    timm = pytest.importorskip("timm", reason="timm is not installed")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10)
    batches = [(x, torch.randint(0, 10, (2,))) for (x,) in _batches(1, (2, 3, 32, 32))]
    compare(model, batches, lambda out, b: F.cross_entropy(out, b[1]), forward_args=1, rtol=1e-3, atol=1e-4)
