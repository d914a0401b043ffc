"""The processes of tests/distributed/test_ipc.py: {{ cookiecutter.device }} tensors shared through torch.multiprocessing
({{ cookiecutter.package }}/ipc.py), as PyTorch's multiprocessing recipes share CUDA tensors.

    python -c "from tests.distributed import ipc_workers; ipc_workers.main('sharing', 'spawn')"

runs one scenario with one start method ('spawn' or 'forkserver') and prints what it saw as one
line of JSON, which the tests check. The children's functions live here, in a module they can
import, as the start methods require.
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.multiprocessing as mp

import {{ cookiecutter.package }}  # noqa: F401  (also with TORCH_DEVICE_BACKEND_AUTOLOAD=0)

DEVICE = "{{ cookiecutter.device }}"
TIMEOUT = 120  # seconds any wait may take before the scenario fails instead of hanging
BIG = 1 << 18  # float32 elements (1 MiB): a block of its own in the device allocator
module = getattr(torch, DEVICE)


def context(method: str):
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", __name__])  # children fork from a process that imported them
    return ctx


# ---- children --------------------------------------------------------------------------------------


def write_in_place(tensors, replies, done):
    """Receives a view of the parent's tensor, reports what it holds, overwrites it in place."""
    (view,) = tensors.get(timeout=TIMEOUT)
    replies.put({"received": view.cpu().tolist(), "device": str(view.device)})
    view.copy_(torch.arange(1, view.numel() + 1, dtype=view.dtype, device=view.device))
    module.synchronize()  # written before the parent is told
    done.set()


def make_and_send(tensors, received):
    """Sends a tensor made here, and exits once the parent has it."""
    tensors.put(torch.arange(6, dtype=torch.float32, device=DEVICE).reshape(2, 3) * 2)
    received.wait(TIMEOUT)


def hold_until_told(tensors, replies, commands):
    """Holds a received tensor while the parent reuses its memory, then lets go of it."""
    big = tensors.get(timeout=TIMEOUT)
    commands.get(timeout=TIMEOUT)  # the parent has dropped its tensor and allocated others
    replies.put(bool((big == 3).all()))
    del big
    gc.collect()
    replies.put("released")
    commands.get(timeout=TIMEOUT)


def train_shared(model, rank, steps, done):
    """Hogwild: trains the parameters the parent shares, in place (no copy of them here)."""
    torch.manual_seed(rank)
    x = torch.randn(64, 4, device=DEVICE)
    y = x.sum(dim=1, keepdim=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    module.synchronize()
    done.put(rank)


class DeviceSquares(torch.utils.data.Dataset):
    """Each item made on the device in the worker that loads it."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((3,), float(i * i), device=DEVICE)


# ---- scenarios (the parent's side) -----------------------------------------------------------------


def sharing(method: str) -> dict:
    ctx = context(method)
    seen: dict = {}

    # a child writes the parent's tensor in place; it sees the work queued before the send
    t = torch.zeros(8, device=DEVICE)
    if "spin" in module.capabilities():
        module._sleep(50_000)  # the fill below waits behind this on the stream when the send starts
    t[2:6].fill_(7)
    tensors, replies, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=write_in_place, args=(tensors, replies, done))
    child.start()
    tensors.put((t[2:6],))
    seen["child"] = replies.get(timeout=TIMEOUT)
    seen["written"] = done.wait(TIMEOUT)
    seen["parent_after"] = t.cpu().tolist()
    child.join(TIMEOUT)
    seen["child_exit"] = child.exitcode

    # the parent receives a child's tensor and keeps it after the child exits
    tensors, received = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=make_and_send, args=(tensors, received))
    child.start()
    r = tensors.get(timeout=TIMEOUT)
    received.set()
    child.join(TIMEOUT)
    seen["maker_exit"] = child.exitcode
    seen["kept"] = r.cpu().tolist()
    r.add_(1)
    seen["kept_device"] = str(r.device)
    seen["kept_plus_one"] = r.cpu().tolist()

    # the sender keeps a block a receiver holds (its allocator does not reuse it), then frees it
    tensors, replies, commands = ctx.Queue(), ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=hold_until_told, args=(tensors, replies, commands))
    child.start()
    module.synchronize()
    gc.collect()
    module.ipc_collect()
    before = module.memory_allocated()
    big = torch.full((BIG,), 3.0, device=DEVICE)
    tensors.put(big)
    del big
    others = [torch.full((BIG,), 9.0, device=DEVICE) for _ in range(4)]  # would take a freed block
    module.synchronize()
    commands.put("check")
    seen["held_intact"] = replies.get(timeout=TIMEOUT)
    seen["allocated_while_held"] = module.memory_allocated() - before - 4 * BIG * 4
    seen["released"] = replies.get(timeout=TIMEOUT)
    seen["still_held"] = module.ipc_collect()
    seen["allocated_after"] = module.memory_allocated() - before - 4 * BIG * 4
    commands.put("exit")
    child.join(TIMEOUT)
    seen["holder_exit"] = child.exitcode
    del others
    return seen


def hogwild(method: str) -> dict:
    ctx = context(method)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(DEVICE)
    model.share_memory()  # a no-op for device memory, as for CUDA's; the parameters stay put
    x = torch.randn(256, 4, device=DEVICE)
    y = x.sum(dim=1, keepdim=True)
    before = torch.nn.functional.mse_loss(model(x), y).item()
    weight = model.weight.detach().clone()
    done = ctx.Queue()
    children = [ctx.Process(target=train_shared, args=(model, rank, 40, done)) for rank in range(2)]
    for c in children:
        c.start()
    finished = sorted(done.get(timeout=TIMEOUT) for _ in children)
    for c in children:
        c.join(TIMEOUT)
    with torch.no_grad():
        after = torch.nn.functional.mse_loss(model(x), y).item()
    return {
        "finished": finished,
        "exits": [c.exitcode for c in children],
        "device": str(model.weight.device),
        "weight_changed": not torch.equal(model.weight.detach(), weight),
        "loss_before": before,
        "loss_after": after,
    }


def dataloader(method: str) -> dict:
    loader = torch.utils.data.DataLoader(DeviceSquares(), batch_size=2, num_workers=2,
                                         multiprocessing_context=context(method))
    batches = list(loader)
    return {
        "devices": sorted({str(b.device) for b in batches}),
        "values": [b.cpu().tolist() for b in batches],
    }


def unsupported(method: str) -> dict:
    """A driver without ipc: the sender of a Process's arguments gets an error naming the capability,
    and so does the receiver of a Queue's message (the sender's feeder thread cannot raise), which
    does not wait."""
    if "ipc" in module.capabilities():
        return {"supported": True}
    ctx = context(method)
    try:
        ctx.Process(target=make_and_send, args=(torch.ones(2, device=DEVICE), None)).start()
        sent = None
    except Exception as e:
        sent = f"{type(e).__name__}: {e}"
    tensors, received = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=make_and_send, args=(tensors, received))
    child.start()
    try:
        tensors.get(timeout=TIMEOUT)
        error = None
    except Exception as e:  # the rebuilt message raises as it is unpickled
        error = f"{type(e).__name__}: {e}"
    received.set()
    child.join(TIMEOUT)
    return {"supported": False, "sent": sent, "error": error, "child_exit": child.exitcode}


def main(scenario: str, method: str) -> None:
    seen = globals()[scenario](method)
    sys.stdout.write(json.dumps(seen) + "\n")
