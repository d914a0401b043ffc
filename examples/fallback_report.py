"""Which operators of a training step ran on the CPU fallback, and the add-op command for them.

    python examples/fallback_report.py [--device NAME] [--project DIR] [--steps N]

A generated backend runs every operator without a native kernel through its CPU fallback
(csrc/aten/fallback.cpp), which counts calls and time per operator: `torch.NAME.fallback_stats()`.
This example trains a small attention block with AdamW for a few steps, then lists the operators
that fell back, ranked by time, each with the `backendgen add-op` argument that gives it a native
kernel (the same mapping `backendgen profile` uses), and one command that adds them all. The
project is found from the installed backend (an editable install), or given with --project.
Exits 1 if the step ran nothing on the fallback (a report with nothing in it shows nothing).

`backendgen profile SCRIPT` does this for any script without changing it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import backend_device, fail, parser


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))


def project_of(device: str, given: Path | None) -> Path | None:
    """The generated project the installed backend was built from (its editable install's source)."""
    if given is not None:
        return given
    package = importlib.import_module(
        getattr(torch, device).__name__.split(".")[0]
    )  # torch.NAME is the package's device module
    for d in Path(package.__file__).resolve().parents:
        if (d / "backendgen.json").is_file():
            return d
    return None


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--project", type=Path, help="the backend's generated project [default: found from the installed backend]"
    )
    p.add_argument("--steps", type=int, default=3)
    opts = p.parse_args()
    device = backend_device(opts.device)
    mod = getattr(torch, device)

    torch.manual_seed(0)
    model = Block().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16, 32, device=device)
    y = torch.randint(0, 10, (8,), device=device)
    mod.reset_fallback_counts()
    for _ in range(opts.steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    mod.synchronize()
    stats = {name: (calls, seconds) for name, (calls, seconds) in mod.fallback_stats().items() if calls}
    print(
        f"{opts.steps} training steps on {device} (loss {loss.item():.4f}); "
        f"{len(stats)} operators ran on the CPU fallback, {sum(c for c, _ in stats.values())} calls, "
        f"{sum(s for _, s in stats.values()):.3f} s"
    )
    if not stats:
        fail("nothing ran on the CPU fallback: nothing to report")

    root = project_of(device, opts.project)
    try:
        from backendgen.commands.profile import add_op_command, analyze
        from backendgen.project.on_disk import Project
        from backendgen.torchdb.opdb import load_opdb
    except ImportError:
        root = None  # backendgen is not installed here: list the operators only
    if root is None:
        for name, (calls, seconds) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
            print(f"  {calls:5d}  {seconds:.4f} s  {name}")
        print("(no backendgen project found: pass --project DIR for the add-op arguments)")
        return

    entries = analyze({k: [c, s] for k, (c, s) in stats.items()}, load_opdb(), Project.load(root))
    print(f"{'calls':>6} {'seconds':>8}  operator -> backendgen add-op")
    for e in entries:
        target = e.target if e.reason is None else f"- ({e.reason})"
        print(f"{e.calls:6d} {e.seconds:8.4f}  {' + '.join(e.names)} -> {target}")
    targets = [e.target for e in entries if e.target is not None and e.reason is None]
    command = add_op_command(targets, root)
    if command:
        print("to make them native (kernels, registrations and tests, then a rebuild):")
        print(f"  {command}")


if __name__ == "__main__":
    main()
