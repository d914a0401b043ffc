"""Sparse tensors on the device (csrc/aten/sparse.cpp): COO construction and metadata, operators
through the sparse CPU fallback, sparse gradients and the optimizers that take them, serialization,
and the compressed layouts — each against the same computation on the CPU."""

import copy
import io

import pytest
import torch

from tests.conftest import DEVICE

# PyTorch's notes on sparse tensors (CSR is beta; invariant checks are off unless asked for)
pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")]


def coo():
    """A small uncoalesced COO matrix on the CPU (index (1, 0) twice) with a dense dimension-free shape."""
    i = torch.tensor([[0, 1, 1, 2], [2, 0, 0, 1]])
    v = torch.tensor([3.0, 4.0, 5.0, 6.0])
    return torch.sparse_coo_tensor(i, v, (3, 3))


def dense_of(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu()
    return t.to_dense() if t.layout != torch.strided else t


def assert_same(device_result: torch.Tensor, cpu_result: torch.Tensor):
    """Same layout, shape, dtype and values, the device result on the device."""
    assert device_result.device.type == DEVICE
    assert device_result.layout == cpu_result.layout
    assert device_result.shape == cpu_result.shape and device_result.dtype == cpu_result.dtype
    torch.testing.assert_close(dense_of(device_result), dense_of(cpu_result), equal_nan=True)


# ---- construction and metadata -----------------------------------------------------------------


def test_sparse_coo_tensor_on_the_device():
    c = coo()
    d = torch.sparse_coo_tensor(c._indices().to(DEVICE), c._values().to(DEVICE), (3, 3), device=DEVICE)
    assert d.layout == torch.sparse_coo and d.is_sparse and d.device.type == DEVICE
    assert d._indices().device.type == DEVICE and d._values().device.type == DEVICE
    assert_same(d, c)


def test_sparse_coo_tensor_with_invariant_checks():
    c = coo()
    with torch.sparse.check_sparse_tensor_invariants():
        d = torch.sparse_coo_tensor(c._indices().to(DEVICE), c._values().to(DEVICE), (3, 3))
        with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
            torch.sparse_coo_tensor(c._indices().to(DEVICE), c._values().to(DEVICE), (2, 3))
    assert_same(d, c)


def test_to_device_and_back():
    c = coo()
    d = c.to(DEVICE)
    assert_same(d, c)
    back = d.cpu()
    assert back.layout == torch.sparse_coo and back.device.type == "cpu"
    assert torch.equal(back._indices(), c._indices()) and torch.equal(back._values(), c._values())
    assert d.is_coalesced() == c.is_coalesced() and d.coalesce().to(DEVICE).is_coalesced()


def test_dense_to_sparse():
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    assert_same(x.to(DEVICE).to_sparse(), x.to_sparse())
    assert_same(x.to(DEVICE).to_sparse(1), x.to_sparse(1))


def test_metadata():
    c = coo()
    d = c.to(DEVICE)
    assert (d._nnz(), d.sparse_dim(), d.dense_dim(), d.is_coalesced()) == (c._nnz(), c.sparse_dim(), c.dense_dim(), False)
    cc, dc = c.coalesce(), d.coalesce()
    assert dc.is_coalesced() and torch.equal(dc.indices().cpu(), cc.indices()) and torch.equal(dc.values().cpu(), cc.values())
    with pytest.raises(RuntimeError, match="uncoalesced"):
        d.indices()


def test_indices_and_values_are_views_of_the_sparse_tensor():
    d = coo().coalesce().to(DEVICE)
    d._values().mul_(10)
    d._indices()[1, 0] = 1
    assert torch.equal(d._values().cpu(), coo().coalesce()._values() * 10)
    assert d._indices().cpu()[1, 0] == 1
    assert d.values()._base is not None or d.values().data_ptr() == d._values().data_ptr()


def test_empty_zeros_and_resize():
    e = torch.empty(3, 4, layout=torch.sparse_coo, device=DEVICE)
    assert e.layout == torch.sparse_coo and e._nnz() == 0 and e.device.type == DEVICE
    z = torch.zeros(3, 4, layout=torch.sparse_coo, device=DEVICE)
    assert_same(z, torch.zeros(3, 4, layout=torch.sparse_coo))
    d, c = coo().to(DEVICE), coo()
    d.sparse_resize_((4, 5), 2, 0)
    c.sparse_resize_((4, 5), 2, 0)
    assert_same(d, c)
    d.sparse_resize_and_clear_((2, 2, 2), 1, 2)
    c.sparse_resize_and_clear_((2, 2, 2), 1, 2)
    assert_same(d, c)
    assert (d.sparse_dim(), d.dense_dim(), d._nnz()) == (1, 2, 0)


def test_copy_between_host_and_device_sparse():
    c = coo()
    d = torch.zeros(3, 3, layout=torch.sparse_coo, device=DEVICE)
    d.copy_(c)
    assert_same(d, c)
    back = torch.zeros(3, 3, layout=torch.sparse_coo)
    back.copy_(d * 2)
    torch.testing.assert_close(back.to_dense(), c.to_dense() * 2)
    with pytest.raises(RuntimeError, match="between dense and sparse"):
        torch.zeros(3, 3, device=DEVICE).copy_(d)


def test_clone_deepcopy_and_dtype():
    c = coo()
    d = c.to(DEVICE)
    assert_same(d.clone(), c.clone())
    assert_same(copy.deepcopy(d), c)
    assert_same(d.double(), c.double())
    assert_same(d.to(DEVICE, torch.float16), c.half())


def test_a_sparse_tensor_stays_on_its_device():
    if torch.accelerator.device_count() < 2:
        pytest.skip("one device")
    d = coo().to(f"{DEVICE}:1")
    for r in (d.coalesce(), d + d, d.to_dense(), torch.sparse.sum(d, 0), d.clone()):
        assert r.device == torch.device(DEVICE, 1)
        if r.layout == torch.sparse_coo:
            assert r._values().device == torch.device(DEVICE, 1)


# ---- operators through the sparse CPU fallback ---------------------------------------------------


UNARY = {
    "coalesce": lambda x: x.coalesce(),
    "to_dense": lambda x: x.to_dense(),
    "neg": lambda x: -x,
    "abs": torch.abs,
    "sin": torch.sin,
    "sqrt": torch.sqrt,
    "pow": lambda x: x.pow(2),
    "mul_scalar": lambda x: x * 3,
    "div_scalar": lambda x: x / 2,
    "nan_to_num": torch.nan_to_num,
    "sum": torch.sum,
    "sparse_sum": torch.sparse.sum,
    "sparse_sum_dim": lambda x: torch.sparse.sum(x, 1),
    "sum_dim_dense": lambda x: x.sum(0),
    "transpose": lambda x: x.t(),
    "permute": lambda x: x.permute(1, 0),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "index_select": lambda x: x.index_select(0, torch.tensor([2, 0], device=x.device)),
    "narrow_copy": lambda x: x.narrow_copy(1, 1, 2),
    "cat": lambda x: torch.cat([x, x], 1),
    "softmax": lambda x: torch.sparse.softmax(x, 1),
    "log_softmax": lambda x: torch.sparse.log_softmax(x, 0),
    "norm": lambda x: x.norm(),
    "mv": lambda x: torch.mv(x, torch.arange(3.0, device=x.device)),
    "zeros_like": torch.zeros_like,
    "sparse_mask": lambda x: torch.arange(9.0, device=x.device).reshape(3, 3).sparse_mask(x.coalesce()),
    "zero_": lambda x: x.clone().zero_(),
    "mul_": lambda x: x.clone().mul_(2),
    "relu": lambda x: x.relu(),
    "smm": lambda x: torch.smm(x, torch.ones(3, 2, device=x.device)),  # one argument passed twice
    "hspmm": lambda x: torch.hspmm(x, torch.ones(3, 2, device=x.device)),
    "sparse_sparse_mm": lambda x: torch.sparse.mm(x, x),
    "select": lambda x: x.select(0, 1),
    "stack": lambda x: torch.stack([x, x]),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_sparse_operator_matches_cpu(name):
    fn = UNARY[name]
    c = coo()
    assert_same(fn(c.to(DEVICE)), fn(c))


def test_arithmetic_with_dense_and_sparse_operands():
    c = coo()
    dense = torch.randn(3, 3)
    d, dd = c.to(DEVICE), dense.to(DEVICE)
    assert_same(dd + d, dense + c)
    assert_same(d + d, c + c)
    assert_same(d - d * 2, c - c * 2)
    assert_same(d * d, c * c)
    assert_same(d * dd, c * dense)
    assert_same(torch.sparse.mm(d, dd), torch.sparse.mm(c, dense))
    assert_same(d @ dd, c @ dense)
    assert_same(torch.sparse.addmm(dd, d, dd, beta=0.5, alpha=2.0), torch.sparse.addmm(dense, c, dense, beta=0.5, alpha=2.0))
    assert_same(torch.addmm(dd, d, dd), torch.addmm(dense, c, dense))


def test_in_place_operators_write_back():
    c, dense = coo(), torch.randn(3, 3)
    d, dd = c.to(DEVICE), dense.to(DEVICE)
    dd.add_(d, alpha=2)  # dense += sparse: the dense argument is written back
    dense.add_(c, alpha=2)
    assert_same(dd, dense)
    s, sc = d.clone(), c.clone()
    s.add_(d)  # sparse += sparse: the device tensor takes the new indices and values
    sc.add_(c)
    assert_same(s, sc)
    assert s._nnz() == sc._nnz()
    out, out_c = torch.zeros(3, 3, layout=torch.sparse_coo, device=DEVICE), torch.zeros(3, 3, layout=torch.sparse_coo)
    torch.add(d, d, out=out)
    torch.add(c, c, out=out_c)
    assert_same(out, out_c)


def test_sparse_mm_backward():
    c, w = coo().coalesce(), torch.randn(3, 2)
    a = c.clone().requires_grad_()
    ad = c.to(DEVICE).requires_grad_()
    wc = w.clone().requires_grad_()
    wd = w.to(DEVICE).requires_grad_()
    torch.sparse.mm(a, wc).pow(2).sum().backward()
    torch.sparse.mm(ad, wd).pow(2).sum().backward()
    assert_same(ad.grad, a.grad)
    assert_same(wd.grad, wc.grad)


def test_an_operator_with_no_sparse_kernel_names_the_operator_and_layout():
    d = coo().to(DEVICE)
    with pytest.raises(NotImplementedError, match="aten::.*sparse COO"):
        torch.linalg.svd(d)
    with pytest.raises((NotImplementedError, RuntimeError), match="Sparse|sparse"):
        torch.cumsum(d, 0)


# ---- sparse gradients, optimizers, serialization --------------------------------------------------


def test_embedding_sparse_gradient():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, sparse=True, padding_idx=0)
    emb_d = copy.deepcopy(emb).to(DEVICE)
    idx = torch.tensor([[1, 2, 0], [2, 5, 9]])
    emb(idx).pow(2).sum().backward()
    emb_d(idx.to(DEVICE)).pow(2).sum().backward()
    assert emb_d.weight.grad.layout == torch.sparse_coo
    assert_same(emb_d.weight.grad, emb.weight.grad)
    # a second backward accumulates into the sparse gradient
    emb(idx).sum().backward()
    emb_d(idx.to(DEVICE)).sum().backward()
    assert_same(emb_d.weight.grad.coalesce(), emb.weight.grad.coalesce())


@pytest.mark.parametrize("mode", ["sum", "mean"])  # "max" has no sparse gradient in PyTorch
def test_embedding_bag_sparse_gradient(mode):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 4, mode=mode, sparse=True)
    bag_d = copy.deepcopy(bag).to(DEVICE)
    idx, offsets = torch.tensor([1, 2, 2, 5, 7, 1]), torch.tensor([0, 2, 5])
    weights = torch.rand(6) if mode == "sum" else None
    bag(idx, offsets, per_sample_weights=weights).pow(2).sum().backward()
    bag_d(idx.to(DEVICE), offsets.to(DEVICE),
          per_sample_weights=None if weights is None else weights.to(DEVICE)).pow(2).sum().backward()
    assert bag_d.weight.grad.layout == torch.sparse_coo
    assert_same(bag_d.weight.grad, bag.weight.grad)


@pytest.mark.parametrize("optim", [
    (torch.optim.SparseAdam, {"lr": 0.05}),
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "weight_decay": 0.0, "maximize": True}),
    (torch.optim.Adagrad, {"lr": 0.1}),
], ids=["SparseAdam", "SGD", "SGD-maximize", "Adagrad"])
def test_optimizer_on_sparse_gradients(optim):
    cls, kwargs = optim
    torch.manual_seed(0)
    emb = torch.nn.Embedding(12, 3, sparse=True)
    emb_d = copy.deepcopy(emb).to(DEVICE)
    opt, opt_d = cls(emb.parameters(), **kwargs), cls(emb_d.parameters(), **kwargs)
    for step in range(4):
        idx = torch.tensor([1, 3, 3, 5 + step])
        for m, o, x in ((emb, opt, idx), (emb_d, opt_d, idx.to(DEVICE))):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    torch.testing.assert_close(emb_d.weight.detach().cpu(), emb.weight.detach())
    for (k, v), (_, vd) in zip(sorted(opt.state[emb.weight].items()), sorted(opt_d.state[emb_d.weight].items())):
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(dense_of(vd), dense_of(v), msg=k)
        else:
            assert vd == v, k


def test_save_and_load_a_device_sparse_tensor():
    d = coo().to(DEVICE)
    buf = io.BytesIO()
    torch.save({"sparse": d, "coalesced": d.coalesce()}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert_same(loaded["sparse"], coo())
    assert loaded["coalesced"].is_coalesced()
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")["sparse"]
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu.to_dense(), coo().to_dense())


def test_recommender_trains_like_the_cpu():
    """EmbeddingBag(sparse=True) + Linear, a few SparseAdam (embeddings) and Adam (dense) steps."""

    class Recommender(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.users = torch.nn.EmbeddingBag(20, 8, mode="mean", sparse=True)
            self.items = torch.nn.EmbeddingBag(30, 8, mode="sum", sparse=True)
            self.head = torch.nn.Linear(16, 1)

        def forward(self, users, user_offsets, items, item_offsets):
            u = self.users(users, user_offsets)
            i = self.items(items, item_offsets)
            return self.head(torch.cat([u, i], 1)).squeeze(1)

    def train(model, device):
        torch.manual_seed(1)
        model = model.to(device)
        sparse_opt = torch.optim.SparseAdam(list(model.users.parameters()) + list(model.items.parameters()), lr=0.05)
        dense_opt = torch.optim.Adam(model.head.parameters(), lr=0.05)
        losses = []
        for _ in range(4):
            users = torch.randint(0, 20, (12,))
            items = torch.randint(0, 30, (18,))
            offsets_u, offsets_i = torch.arange(0, 12, 2), torch.arange(0, 18, 3)
            target = torch.rand(6)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            out = model(users.to(device), offsets_u.to(device), items.to(device), offsets_i.to(device))
            loss = torch.nn.functional.mse_loss(out, target.to(device))
            loss.backward()
            assert model.users.weight.grad.is_sparse and model.head.weight.grad.layout == torch.strided
            sparse_opt.step()
            dense_opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    torch.manual_seed(0)
    model = Recommender()
    cpu_losses, cpu_params = train(copy.deepcopy(model), "cpu")
    dev_losses, dev_params = train(copy.deepcopy(model), DEVICE)
    torch.testing.assert_close(dev_losses, cpu_losses)
    for a, b in zip(dev_params, cpu_params):
        torch.testing.assert_close(a, b)


# ---- compressed layouts (CSR, CSC, BSR) -----------------------------------------------------------


def matrix():
    return torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 0.0, 3.0, 4.0], [5.0, 0.0, 0.0, 0.0]])


def test_csr_construction_and_members():
    m = matrix()
    c = m.to_sparse_csr()
    d = m.to(DEVICE).to_sparse_csr()
    assert_same(d, c)
    for member in ("crow_indices", "col_indices", "values"):
        got = getattr(d, member)()
        assert got.device.type == DEVICE and torch.equal(got.cpu(), getattr(c, member)())
    assert d._nnz() == c._nnz() and d.sparse_dim() == 2 and d.dense_dim() == 0
    built = torch.sparse_csr_tensor(c.crow_indices().to(DEVICE), c.col_indices().to(DEVICE), c.values().to(DEVICE), c.shape)
    assert_same(built, c)
    d.values().mul_(2)  # a view of the tensor's values
    torch.testing.assert_close(d.to_dense().cpu(), m * 2)


def test_csr_copies_and_operators():
    m, dense = matrix(), torch.randn(4, 2)
    c, d = m.to_sparse_csr(), m.to_sparse_csr().to(DEVICE)
    assert_same(d, c)
    assert d.cpu().layout == torch.sparse_csr and torch.equal(d.cpu().to_dense(), m)
    assert_same(d.clone(), c.clone())
    assert_same(d.to_dense(), m)
    assert_same(d + d, c + c)
    assert_same(d * 2, c * 2)
    assert_same(d.sin(), c.sin())
    assert_same(d.sum(), c.sum())
    assert_same(d @ dense.to(DEVICE), c @ dense)
    assert_same(d.to_sparse(), c.to_sparse())
    assert_same(d.clone().neg_(), c.clone().neg_())
    assert_same(m.to(DEVICE).to_sparse_csc(), m.to_sparse_csc())
    assert_same(m.to(DEVICE).to_sparse_bsr((1, 2)), m.to_sparse_bsr((1, 2)))


def test_a_compressed_view_through_the_fallback_is_an_error_not_a_copy():
    d = matrix().to(DEVICE).to_sparse_csr()
    with pytest.raises(RuntimeError, match="aten::select.int returns a view"):
        d.select(0, 1)
