"""Train a small CNN on the device with torch.autocast, a GradScaler and an optimizer.

    python examples/train.py [--device NAME] [--steps N] [--dtype bfloat16|float16] [--optimizer adam|sgd]

The data is synthetic and learnable (class 1 images have a brighter left half in their first
channel), so the loss must fall: the example exits 1 if the loss on a held-out batch did not fall, or if
anything left the device. Under autocast the convolution and linear
layers compute in the lower precision (the device's autocast policy, csrc/aten/autocast.cpp) and
the loss in float32; the weights and the optimizer's state stay float32 on the device.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import backend_device, fail, parser


def batch(n: int, device: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 3, 16, 16, generator=gen)
    x[:, 0, :, :8] += y.view(n, 1, 1).float() - 0.5  # class 1: the left half of channel 0 is brighter
    return x.to(device), y.to(device)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16"],
        default="bfloat16",
        help="autocast's lower precision (float16 adds a GradScaler)",
    )
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    opts = p.parse_args()
    device = backend_device(opts.device)
    if opts.steps < 4:
        fail("--steps must be at least 4", 2)
    dtype = getattr(torch, opts.dtype)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 32),
        nn.ReLU(),
        nn.Linear(32, 2),
    ).to(device)
    if opts.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    print(
        f"training on {device}:{torch.accelerator.current_device_index()} "
        f"({getattr(torch, device).get_device_name()}), "
        f"autocast {opts.dtype}, {type(opt).__name__}, {opts.steps} steps"
    )

    x_eval, y_eval = batch(256, device, gen)

    def evaluate() -> tuple[float, float]:
        model.eval()
        with torch.no_grad(), torch.autocast(device_type=device, dtype=dtype):
            logits = model(x_eval)
        model.train()
        return F.cross_entropy(logits.float(), y_eval).item(), (logits.argmax(1) == y_eval).float().mean().item()

    before = evaluate()
    losses = []
    start = time.perf_counter()
    for step in range(opts.steps):
        x, y = batch(32, device, gen)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        if step == 0:
            print(f"  under autocast: logits {logits.dtype}, loss {loss.dtype}")
            if logits.dtype != dtype or loss.dtype != torch.float32:
                fail(f"autocast did not apply on {device}: logits {logits.dtype}, loss {loss.dtype}")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if step % 5 == 0 or step == opts.steps - 1:
            print(f"  step {step:3d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - start

    off_device = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != device]
    state_dtypes = {t.dtype for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0}
    after = evaluate()
    print(
        f"held-out batch: loss {before[0]:.4f} -> {after[0]:.4f}, accuracy {before[1]:.0%} -> {after[1]:.0%} "
        f"({seconds:.1f} s of training)"
    )
    print(
        f"weights: {next(model.parameters()).dtype} on {next(model.parameters()).device}; "
        f"optimizer state: {sorted(str(d) for d in state_dtypes) or 'none'}"
    )
    if off_device:
        fail(f"left the device: {off_device}")
    if not after[0] < before[0]:
        fail("the held-out loss did not fall")
    print("ok: the model trained on the device")


if __name__ == "__main__":
    main()
