"""Data-parallel training on {{ cookiecutter.device }} devices, one process per device:

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 20

Each process trains the same small network on its own share of every batch; DistributedDataParallel
averages the gradients across processes through the {{ cookiecutter.device }} collective backend
({{ cookiecutter.package }}/distributed.py), which `init_process_group()` picks for {{ cookiecutter.device }} tensors
without being named. Rank 0 prints the loss; at the end every rank checks that all ranks hold the
same parameters.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import {{ cookiecutter.package }}  # noqa: F401  (plain `import torch` loads it too, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="global batch size, split across processes")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.{{ cookiecutter.device }}.set_device(local_rank)
    device = torch.device("{{ cookiecutter.device }}", local_rank)
    # env:// from torchrun; the backend comes from the device; device_id binds the group to this
    # rank's device at once
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(16, 1)
    data = torch.Generator().manual_seed(1)  # the same batches on every rank; each takes its share
    per_rank = args.batch // world
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=data)
        y = x @ target
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = torch.nn.functional.mse_loss(model(x[mine].to(device)), y[mine].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g.cpu(), flat.cpu()) for g in gathered), "ranks disagree on the parameters"
    if rank == 0:
        print(f"done: {world} processes on {device.type}, parameters identical on every rank", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
