"""Data-parallel training across processes on the device: DistributedDataParallel over the
backend's collective backend, checked against one process training on the whole batch.

    python examples/train_ddp.py [--device NAME] [--nproc 2] [--steps 10]

Starts --nproc processes (torch.multiprocessing, spawn), each on its own device when the backend
has enough (`<DEVICE>_DEVICE_COUNT`), else sharing them. `init_process_group()` is called without a
backend: the generated backend registers its own for device tensors (<package>/distributed.py),
as NCCL is for CUDA. Each process trains the same network on its share of every batch; DDP averages
the gradients. The example exits 1 unless every process ends with the parameters one process gets
from the same steps on the whole batch. (In a generated project, examples/train_ddp.py is the same
job for torchrun: `torchrun --nproc-per-node 2 examples/train_ddp.py`.)
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common, also in the spawned processes
from _common import backend_device, fail, parser

BATCH = 24


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batches(steps: int):
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(16, 1, generator=gen)
    for _ in range(steps):
        x = torch.randn(BATCH, 16, generator=gen)
        yield x, x @ target


def worker(rank: int, world: int, device_type: str, port: int, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(device_type, rank % getattr(torch, device_type).device_count())
    getattr(torch, device_type).set_device(device.index)
    dist.init_process_group(rank=rank, world_size=world)  # no backend named: the device's own
    try:
        model = DistributedDataParallel(make_model().to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        share = BATCH // world
        for x, y in batches(steps):
            mine = slice(rank * share, (rank + 1) * share)
            loss = torch.nn.functional.mse_loss(model(x[mine].to(device)), y[mine].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        backend = dist.Backend.default_device_backend_map.get(device_type)  # what init_process_group chose
        # plain lists: a tensor sent through a queue lives in memory its (exiting) sender shares
        queue.put((rank, backend, [p.detach().cpu().tolist() for p in model.module.parameters()]))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    opts = p.parse_args()
    device = backend_device(opts.device)
    if opts.nproc < 2 or BATCH % opts.nproc:
        fail(f"--nproc must be at least 2 and divide the batch of {BATCH}", 2)
    if not dist.is_available():
        fail("this torch has no torch.distributed", 2)

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        worker, args=(opts.nproc, device, free_port(), opts.steps, queue), nprocs=opts.nproc, start_method="spawn"
    )
    results = sorted(queue.get() for _ in range(opts.nproc))

    # the same steps in one process on the whole batch
    single = make_model().to(device)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for x, y in batches(opts.steps):
        loss = torch.nn.functional.mse_loss(single(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    expected = [p.detach().cpu() for p in single.parameters()]
    initial = [p.detach() for p in make_model().parameters()]
    if all(torch.equal(a, b) for a, b in zip(expected, initial, strict=True)):
        fail("training did not change the parameters: nothing to compare")
    for rank, _backend, params in results:
        for got, want in zip(map(torch.tensor, params), expected, strict=True):
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
                fail(
                    f"rank {rank}: parameters differ from one process on the whole batch "
                    f"(max difference {(got - want).abs().max().item():.3g})"
                )
    print(
        f"{opts.nproc} processes on {device} (c10d backend {results[0][1]!r}), {opts.steps} DDP steps: "
        "every rank holds the parameters one process gets on the whole batch"
    )


if __name__ == "__main__":
    main()
