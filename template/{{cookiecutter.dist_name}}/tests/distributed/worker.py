"""One rank of a multi-process test of the {{ cookiecutter.device }} collective backend ({{ cookiecutter.package }}/distributed.py).

Started once per rank by tests/distributed/launch.py or by torchrun, which both pass RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment:

    python -m tests.distributed.worker collectives ddp fsdp
    torchrun --nproc-per-node 2 -m tests.distributed.worker collectives

Each rank uses its own device ({{ cookiecutter.device }}:LOCAL_RANK), checks every collective against its
definition (every rank computes what each rank contributed, so it knows the exact answer), and
exits non-zero on the first difference. The last line a rank prints is `PASSED <scenario>: <n> checks`.
"""

from __future__ import annotations

import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

import {{ cookiecutter.package }}  # noqa: F401  (also with TORCH_DEVICE_BACKEND_AUTOLOAD=0)

DEVICE = "{{ cookiecutter.device }}"
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("{{ cookiecutter.DEVICE }}_DIST_TIMEOUT", "60")))

# Exact in every dtype below: small integers, and sums of at most 4 of them.
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16]


class Checker:
    def __init__(self):
        self.count = 0

    def equal(self, what: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        self.count += 1
        actual = actual.cpu()
        if actual.dtype != expected.dtype or actual.shape != expected.shape or not torch.equal(actual, expected):
            raise AssertionError(
                f"rank {dist.get_rank()}: {what}: got {actual.dtype} {tuple(actual.shape)} {actual.flatten()[:12].tolist()}, "
                f"expected {expected.dtype} {tuple(expected.shape)} {expected.flatten()[:12].tolist()}"
            )

    def close(self, what: str, actual: torch.Tensor, expected: torch.Tensor, **tol) -> None:
        self.count += 1
        try:
            torch.testing.assert_close(actual.cpu(), expected.cpu(), **tol)
        except AssertionError as e:
            raise AssertionError(f"rank {dist.get_rank()}: {what}: {e}") from None


def data(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """What rank `rank` contributes: small integers that differ between ranks and positions."""
    return ((torch.arange(numel) * 3 + rank * 5 + salt) % 11 + 1).to(dtype)


def finish(work, async_op: bool) -> None:
    if async_op:
        assert work is not None, "async_op=True returned no Work"
        work.wait()
        assert work.is_completed(), "Work.is_completed() is False after wait()"
    else:
        assert work is None


# --- scenarios ----------------------------------------------------------------------------------

def collectives(dev: torch.device, check: Checker) -> None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    ranks = range(ws)
    for dtype in DTYPES:
        for async_op in (False, True):
            tag = f"{dtype} async={async_op}"
            n = 7  # odd on purpose: no size lines up with the world size

            # all_reduce: SUM, MAX, and AVG for floating types
            for op, reduce in [(dist.ReduceOp.SUM, lambda xs: sum(xs)), (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0))]:
                t = data(rank, n, dtype).to(dev)
                finish(dist.all_reduce(t, op=op, async_op=async_op), async_op)
                check.equal(f"all_reduce {op} {tag}", t, reduce([data(r, n, dtype) for r in ranks]).to(dtype))
            if dtype.is_floating_point:
                t = data(rank, n, dtype).to(dev) * ws
                finish(dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=async_op), async_op)
                check.equal(f"all_reduce AVG {tag}", t, sum(data(r, n, dtype) for r in ranks).to(dtype))

            # broadcast from the last rank
            t = data(rank, n, dtype).to(dev)
            finish(dist.broadcast(t, src=ws - 1, async_op=async_op), async_op)
            check.equal(f"broadcast {tag}", t, data(ws - 1, n, dtype))

            # reduce to rank 0
            t = data(rank, n, dtype).to(dev)
            finish(dist.reduce(t, dst=0, async_op=async_op), async_op)
            if rank == 0:
                check.equal(f"reduce {tag}", t, sum(data(r, n, dtype) for r in ranks).to(dtype))

            # all_gather into a list, and into one tensor
            outs = [torch.zeros(n, dtype=dtype, device=dev) for _ in ranks]
            finish(dist.all_gather(outs, data(rank, n, dtype).to(dev), async_op=async_op), async_op)
            for r in ranks:
                check.equal(f"all_gather[{r}] {tag}", outs[r], data(r, n, dtype))
            out = torch.zeros(ws * n, dtype=dtype, device=dev)
            finish(dist.all_gather_into_tensor(out, data(rank, n, dtype).to(dev), async_op=async_op), async_op)
            check.equal(f"all_gather_into_tensor {tag}", out, torch.cat([data(r, n, dtype) for r in ranks]))

            # reduce_scatter: rank r receives the sum over ranks of chunk r
            out = torch.zeros(n, dtype=dtype, device=dev)
            inputs = [data(rank, n, dtype, salt=c).to(dev) for c in ranks]
            finish(dist.reduce_scatter(out, inputs, async_op=async_op), async_op)
            check.equal(f"reduce_scatter {tag}", out, sum(data(r, n, dtype, salt=rank) for r in ranks).to(dtype))
            out = torch.zeros(n, dtype=dtype, device=dev)
            whole = data(rank, ws * n, dtype).to(dev)
            finish(dist.reduce_scatter_tensor(out, whole, async_op=async_op), async_op)
            expected = sum(data(r, ws * n, dtype) for r in ranks).to(dtype)[rank * n:(rank + 1) * n]
            check.equal(f"reduce_scatter_tensor {tag}", out, expected)

            # all_to_all with uneven sizes: rank s sends s + d + 1 elements to rank d
            def piece(src, dst):
                return data(src, src + dst + 1, dtype, salt=dst)

            outs = [torch.zeros(s + rank + 1, dtype=dtype, device=dev) for s in ranks]
            finish(dist.all_to_all(outs, [piece(rank, d).to(dev) for d in ranks], async_op=async_op), async_op)
            for s in ranks:
                check.equal(f"all_to_all from {s} {tag}", outs[s], piece(s, rank))
            out = torch.zeros(sum(s + rank + 1 for s in ranks), dtype=dtype, device=dev)
            inp = torch.cat([piece(rank, d) for d in ranks]).to(dev)
            work = dist.all_to_all_single(
                out, inp, output_split_sizes=[s + rank + 1 for s in ranks],
                input_split_sizes=[rank + d + 1 for d in ranks], async_op=async_op,
            )
            finish(work, async_op)
            check.equal(f"all_to_all_single {tag}", out, torch.cat([piece(s, rank) for s in ranks]))

            # gather to rank 0, scatter from rank 0
            outs = [torch.zeros(n, dtype=dtype, device=dev) for _ in ranks] if rank == 0 else None
            finish(dist.gather(data(rank, n, dtype).to(dev), outs, dst=0, async_op=async_op), async_op)
            if rank == 0:
                for r in ranks:
                    check.equal(f"gather[{r}] {tag}", outs[r], data(r, n, dtype))
            out = torch.zeros(n, dtype=dtype, device=dev)
            pieces = [data(0, n, dtype, salt=r).to(dev) for r in ranks] if rank == 0 else None
            finish(dist.scatter(out, pieces, src=0, async_op=async_op), async_op)
            check.equal(f"scatter {tag}", out, data(0, n, dtype, salt=rank))

            # send/recv around a ring
            nxt, prv = (rank + 1) % ws, (rank - 1) % ws
            got = torch.zeros(n + prv, dtype=dtype, device=dev)
            works = [dist.isend(data(rank, n + rank, dtype).to(dev), nxt), dist.irecv(got, prv)]
            for w in works:
                w.wait()
            check.equal(f"send/recv {tag}", got, data(prv, n + prv, dtype))

    # a non-contiguous tensor (staged through a contiguous copy), a 2-d one, and the barrier
    t = torch.zeros(5, 6, device=dev)
    t.copy_(data(rank, 30, torch.float32).reshape(5, 6))
    view = t.t()[1:4]  # 3x5, strides (1, 6)
    finish(dist.all_reduce(view, async_op=True), True)
    expected = data(rank, 30, torch.float32).reshape(5, 6).clone()
    expected.t()[1:4] = sum(data(r, 30, torch.float32).reshape(5, 6) for r in ranks).t()[1:4]
    check.equal("all_reduce of a non-contiguous view", t, expected)
    dist.barrier()

    # the work's result is ordered with the device stream: use it on a side stream after wait()
    side = torch.Stream(device=dev)
    with torch.{{ cookiecutter.device }}.stream(side):
        t = data(rank, n, torch.float32).to(dev)
        dist.all_reduce(t, async_op=True).wait()
        t.mul_(2)
    side.synchronize()
    check.equal("all_reduce on a side stream", t, 2 * sum(data(r, n, torch.float32) for r in ranks))

    # objects: the default group, bound to the device by device_id, has the device's backend alone
    # (as NCCL's would), so they go through the device
    assert dist.distributed_c10d._get_object_coll_device() == DEVICE
    objects = [None] * ws
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    assert objects == [{"rank": r, "name": f"r{r}"} for r in ranks], objects
    check.count += 1

    # CPU tensors go to PyTorch's own gloo in a group that has it beside the device's backend
    # (a gloo-only new_group fails once the default group is bound to a device, as with CUDA)
    cpu_group = dist.new_group(backend=f"cpu:gloo,{DEVICE}:{DEVICE}ccl")
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:  # else c10d's checking wrapper around it
        assert type(cpu_group._get_backend(torch.device("cpu"))) is dist.ProcessGroupGloo
    c = data(rank, n, torch.float32)
    dist.all_reduce(c, group=cpu_group)
    check.equal("all_reduce of a CPU tensor", c, sum(data(r, n, torch.float32) for r in ranks))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(ws: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(4 * ws, 6, generator=g), torch.randn(4 * ws, 3, generator=g)


def _reference_step(dev: torch.device, ws: int) -> list[torch.Tensor]:
    """One SGD step of the model in this process alone, on the whole batch."""
    model = _model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
    opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def _check_step(check: Checker, what: str, params: list[torch.Tensor], dev: torch.device) -> None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    initial = [p.detach() for p in _model().parameters()]
    reference = _reference_step(dev, ws)
    assert any(not torch.equal(a, b) for a, b in zip(params, initial)), f"{what}: the step changed no parameter"
    for i, (p, ref) in enumerate(zip(params, reference)):
        check.close(f"{what}: parameter {i} equals the single-process step", p, ref, rtol=1e-5, atol=1e-6)
    # and every rank holds the same parameters
    for i, p in enumerate(params):
        gathered = [torch.zeros_like(p, device=dev) for _ in range(ws)]
        dist.all_gather(gathered, p.to(dev))
        for r in range(ws):
            check.equal(f"{what}: parameter {i} of rank {r} equals rank {rank}'s", gathered[r], p.cpu())


def ddp(dev: torch.device, check: Checker) -> None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)  # each rank trains on its quarter of the batch
    torch.nn.functional.mse_loss(model(x[mine].to(dev)), y[mine].to(dev)).backward()
    opt.step()
    _check_step(check, "DDP", [p.detach().cpu() for p in model.module.parameters()], dev)

    # gradient compression hooks: PyTorch refuses bf16_compress_hook by its name on any device but
    # CUDA/XPU; the same hook under another name, and fp16_compress_hook, compress on the device
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def bf16_hook(state, bucket):
        return default_hooks.bf16_compress_hook(state, bucket)

    try:
        torch.nn.parallel.DistributedDataParallel(_model().to(dev)).register_comm_hook(None, default_hooks.bf16_compress_hook)
    except TypeError as e:
        assert "BF16" in str(e), str(e)
    reference = _reference_step(dev, ws)
    for hook in (bf16_hook, default_hooks.fp16_compress_hook):
        model = torch.nn.parallel.DistributedDataParallel(_model().to(dev))
        model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        torch.nn.functional.mse_loss(model(x[mine].to(dev)), y[mine].to(dev)).backward()
        opt.step()
        for i, (p, ref) in enumerate(zip(model.module.parameters(), reference)):
            check.close(f"DDP with {hook.__name__}: parameter {i}", p, ref, rtol=0.02, atol=0.01)


def fsdp(dev: torch.device, check: Checker) -> None:
    from torch.distributed.fsdp import fully_shard

    rank, ws = dist.get_rank(), dist.get_world_size()
    model = _model().to(dev)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    local = [p.to_local() for p in model.parameters()]
    assert all(p.device == dev for p in local), f"FSDP shards are not on {dev}: {[p.device for p in local]}"
    assert sum(p.numel() for p in local) < sum(p.numel() for p in _model().parameters()), "FSDP did not shard"
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)
    torch.nn.functional.mse_loss(model(x[mine].to(dev)), y[mine].to(dev)).backward()
    opt.step()
    _check_step(check, "FSDP", [p.full_tensor().detach().cpu() for p in model.parameters()], dev)


def fsdp_from_cpu(dev: torch.device, check: Checker) -> None:
    """FSDP2 of a module still on the CPU: fully_shard moves it to the mesh's device
    (`param.data = param.to(device)`, which needs `_has_compatible_shallow_copy_type`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(DEVICE, (ws,))
    model = _model()  # on the CPU
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = [p.to_local() for p in model.parameters()]
    assert all(p.device == dev for p in local), f"FSDP shards are not on {dev}: {[p.device for p in local]}"
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)
    torch.nn.functional.mse_loss(model(x[mine].to(dev)), y[mine].to(dev)).backward()
    opt.step()
    _check_step(check, "FSDP of a CPU module", [p.full_tensor().detach().cpu() for p in model.parameters()], dev)


def _cpu_step(model: torch.nn.Module, ws: int) -> torch.nn.Module:
    """One SGD step of `model` on the CPU, in this process alone, on the whole batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return model


def syncbn(dev: torch.device, check: Checker) -> None:
    """nn.SyncBatchNorm in DDP, each rank on its slice of the batch: parameters and running
    statistics equal batch norm in one CPU process on the whole batch."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    ddp_model = torch.nn.parallel.DistributedDataParallel(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model()).to(dev))
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)
    torch.nn.functional.mse_loss(ddp_model(x[mine].to(dev)), y[mine].to(dev)).backward()
    opt.step()
    reference = _cpu_step(model(), ws)
    for (name, p), (_, ref) in zip(ddp_model.module.state_dict().items(), reference.state_dict().items()):
        if p.is_floating_point():
            check.close(f"SyncBatchNorm in DDP: {name} equals one CPU process's", p, ref, rtol=1e-4, atol=1e-5)


def fsdp_bf16(dev: torch.device, check: Checker) -> None:
    """FSDP2 with bf16 mixed precision (parameters and compute in bf16, gradients reduced in float):
    the forward runs in bf16 and the step matches one CPU process's float step to bf16's precision."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, ws = dist.get_rank(), dist.get_world_size()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _model().to(dev)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)
    out = model(x[mine].to(dev))
    assert out.dtype == torch.bfloat16, f"FSDP2's bf16 policy: the forward ran in {out.dtype}"
    torch.nn.functional.mse_loss(out.float(), y[mine].to(dev)).backward()
    opt.step()
    params = [p.full_tensor().detach().cpu() for p in model.parameters()]
    assert all(p.dtype == torch.float32 for p in params), "FSDP2 keeps float parameters"
    for i, (p, ref) in enumerate(zip(params, _cpu_step(_model(), ws).parameters())):
        check.close(f"FSDP2 bf16: parameter {i} near one CPU process's float step", p, ref.detach(), rtol=0.05, atol=0.02)


def tensor_parallel(dev: torch.device, check: Checker) -> None:
    """DTensor and tensor parallelism on a device mesh: sharded and replicated DTensors, and a
    column/row-parallel MLP whose forward and step equal the same MLP on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(DEVICE, (ws,))
    whole = data(0, 4 * ws * 3, torch.float32).reshape(4 * ws, 3)
    sharded = distribute_tensor(whole.to(dev), mesh, [Shard(0)])
    check.equal("DTensor Shard(0): the local shard", sharded.to_local(), whole[4 * rank:4 * rank + 4])
    check.equal("DTensor Shard(0) -> Replicate", sharded.redistribute(mesh, [Replicate()]).to_local(), whole)
    check.equal("DTensor sum of a sharded tensor", sharded.sum().full_tensor(), whole.sum())

    model = parallelize_module(_model().to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert model[0].weight.to_local().shape[0] == 16 // ws, "ColwiseParallel did not shard the first layer"
    x, y = _batch(ws)
    cpu = _model()
    check.close("tensor parallel: forward equals the CPU's", model(x.to(dev)), cpu(x), rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
    opt.step()
    for i, (p, ref) in enumerate(zip(model.parameters(), _cpu_step(_model(), ws).parameters())):
        check.close(f"tensor parallel: parameter {i} equals the CPU step", p.full_tensor(), ref.detach(), rtol=1e-5, atol=1e-6)


def checkpoint(dev: torch.device, check: Checker) -> None:
    """Distributed checkpoint of an FSDP2 model: saved after a step, loaded into a model built
    from other weights, which then holds the saved parameters (and they equal the CPU's step)."""
    import tempfile

    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    rank, ws = dist.get_rank(), dist.get_world_size()
    where = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    model = fully_shard(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = _batch(ws)
    mine = slice(4 * rank, 4 * rank + 4)
    torch.nn.functional.mse_loss(model(x[mine].to(dev)), y[mine].to(dev)).backward()
    opt.step()
    dcp.save(model.state_dict(), checkpoint_id=where[0])

    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    other = fully_shard(other.to(dev))
    state = other.state_dict()
    dcp.load(state, checkpoint_id=where[0])
    other.load_state_dict(state)
    saved = [p.full_tensor().detach().cpu() for p in model.parameters()]
    for i, (p, ref, cpu) in enumerate(zip(other.parameters(), saved, _cpu_step(_model(), ws).parameters())):
        check.equal(f"checkpoint: parameter {i} loaded as saved", p.full_tensor().detach(), ref)
        check.close(f"checkpoint: parameter {i} equals the CPU step", ref, cpu.detach(), rtol=1e-5, atol=1e-6)
    dist.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(where[0], ignore_errors=True)


def mismatch(dev: torch.device, check: Checker) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: ranks that call different collectives all raise, naming
    the mismatch (c10d's ProcessGroupWrapper around the device's backend, as around NCCL)."""
    rank = dist.get_rank()
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL, "run with TORCH_DISTRIBUTED_DEBUG=DETAIL"
    t = torch.ones(3, device=dev)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    except RuntimeError as e:
        assert "Detected mismatch between collectives" in str(e), str(e)
        check.count += 1
    else:
        raise AssertionError(f"rank {rank}: mismatched collectives did not raise")


SCENARIOS = {
    "collectives": collectives, "ddp": ddp, "fsdp": fsdp, "fsdp_from_cpu": fsdp_from_cpu, "syncbn": syncbn,
    "fsdp_bf16": fsdp_bf16, "tensor_parallel": tensor_parallel, "checkpoint": checkpoint, "mismatch": mismatch,
}


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in SCENARIOS]
    if unknown or not argv:
        print(f"usage: worker.py {' '.join(SCENARIOS)} (got {argv})", file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    torch.{{ cookiecutter.device }}.set_device(local_rank)  # each rank on its own device
    dev = torch.device(DEVICE, local_rank)
    # No backend named: torch picks the one registered for the device ({{ cookiecutter.package }}/distributed.py);
    # device_id binds it to this rank's device at once (FSDP2 recipes' eager init).
    dist.init_process_group(init_method="env://", timeout=TIMEOUT, device_id=dev)
    try:
        backend = dist.group.WORLD._get_backend(dev)
        assert backend.name() == f"{DEVICE}ccl" or dist.get_debug_level() == dist.DebugLevel.DETAIL, backend.name()
        for name in argv:
            check = Checker()
            SCENARIOS[name](dev, check)
            print(f"PASSED {name}: {check.count} checks", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
