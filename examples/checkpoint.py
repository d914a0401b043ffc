"""Save a training checkpoint from the device and load it back with map_location across devices.

    python examples/checkpoint.py [--device NAME] [--dir DIR]

A model and its Adam state are trained for a step on device 0 and saved with torch.save. The
checkpoint is then loaded: as saved (device 0), onto the CPU (map_location="cpu"), onto device 1
(map_location="NAME:1", and a {"NAME:0": "NAME:1"} mapping) when the backend has two devices, and
a checkpoint written on the CPU is loaded straight onto the device. Every load is compared with
the original values; training resumed from the checkpoint must take exactly the step the original
run takes next. The backend's own tensor metadata (the layout tag, csrc/aten/serialization.cpp)
survives the round trip. Exits 1 on any difference.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import backend_device, fail, parser


def make(device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def tensors(obj, prefix=""):
    """Every tensor in a (nested) checkpoint, by path."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


def same(loaded, want: dict[str, torch.Tensor], expect_device: str, what: str) -> None:
    got = dict(tensors(loaded))
    if got.keys() != want.keys():
        fail(f"{what}: the checkpoint's tensors differ: {sorted(got.keys() ^ want.keys())}")
    for k, t in got.items():
        if str(t.device) != expect_device and not (
            t.dim() == 0 and t.device.type == "cpu"
        ):  # Adam's step count stays on the CPU
            fail(f"{what}: {k} is on {t.device}, expected {expect_device}")
        if not torch.equal(t.cpu(), want[k]):
            fail(f"{what}: {k} differs from what was saved")
    devices = sorted({str(t.device) for t in got.values()})
    print(f"  {what}: {len(got)} tensors equal to what was saved, on {', '.join(devices)}")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, help="where to write the checkpoints [default: a temporary directory]")
    opts = p.parse_args()
    device = backend_device(opts.device)
    mod = getattr(torch, device)
    d0, d1 = f"{device}:0", f"{device}:1"
    x = torch.randn(32, 8, device=d0)
    y = torch.randn(32, 4, device=d0)

    model, opt = make(d0)
    step(model, opt, x, y)
    tagged = torch.arange(6.0, device=d0)
    mod.set_layout_tag(tagged, True)  # the backend's own metadata on a tensor (c10::BackendMeta)
    checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(), "tagged": tagged}
    original = {k: v.detach().cpu().clone() for k, v in tensors(checkpoint)}

    with tempfile.TemporaryDirectory() as tmp:
        where = opts.dir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"checkpoint-{device}.pt"
        torch.save(checkpoint, path)
        print(f"saved {path.name} ({path.stat().st_size} bytes) from {d0}; loading it back:")
        next_loss = step(model, opt, x, y)  # what the uninterrupted run does next (state_dict() shares its tensors)
        next_weight = model[0].weight.detach().cpu()

        loaded = torch.load(path)
        same(loaded, original, d0, "torch.load(path)")
        if not mod.layout_tag(loaded["tagged"]):
            fail("the layout tag was lost in torch.save/torch.load")
        print("  the layout tag came back with the tensor")

        same(torch.load(path, map_location="cpu"), original, "cpu", 'map_location="cpu"')

        if mod.device_count() >= 2:
            same(torch.load(path, map_location=d1), original, d1, f'map_location="{d1}"')
            same(torch.load(path, map_location={d0: d1}), original, d1, f'map_location={{"{d0}": "{d1}"}}')
        else:
            print(f"  (one {device} device: the loads onto {d1} are skipped)")

        cpu_path = where / "checkpoint-cpu.pt"
        torch.save(torch.load(path, map_location="cpu"), cpu_path)
        same(torch.load(cpu_path, map_location=d0), original, d0, f'a CPU checkpoint, map_location="{d0}"')

        # Resume: a fresh model and optimizer on the device, restored from the checkpoint.
        resumed, resumed_opt = make(d0)
        state = torch.load(path, map_location=d0)
        resumed.load_state_dict(state["model"])
        resumed_opt.load_state_dict(state["optimizer"])
        loss = step(resumed, resumed_opt, x, y)
        if loss != next_loss or not torch.equal(resumed[0].weight.detach().cpu(), next_weight):
            fail(f"training resumed from the checkpoint diverged: loss {loss} vs {next_loss}")
        print(
            f"  resumed from the checkpoint: the next step's loss {loss:.6f} and weights equal the uninterrupted run's"
        )
    print("ok: checkpoints move between the device and the CPU")


if __name__ == "__main__":
    main()
