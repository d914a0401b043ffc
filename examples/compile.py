"""torch.compile on the device: a compiled training step against eager, and fused kernels.

    python examples/compile.py [--device NAME] [--steps N]

`torch.compile(model)` with the default backend (Dynamo + Inductor) works on a generated backend:
its package registers Dynamo's device interface and an Inductor code generator for the device
(`<package>/compiler/`; on the emulated device Inductor's C++ generator, whose fused loops run on
device memory). The example trains two copies of an MLP for a few steps, one eager and one
compiled, and compares losses and weights; then it compiles a pointwise-and-reduction function and
shows the compiled version runs no operator on the CPU fallback where eager mode does. The first
run compiles C++ (tens of seconds on 2 cores); later runs reuse Inductor's cache. Exits 1 on a
mismatch.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import backend_device, fail, parser


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    opts = p.parse_args()
    device = backend_device(opts.device)
    mod = getattr(torch, device)

    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4)).to(device)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(twin.parameters(), lr=0.1)
    x, y = torch.randn(32, 16, device=device), torch.randn(32, 4, device=device)

    start = time.perf_counter()
    for step in range(opts.steps):
        losses = []
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(f"  step {step}: eager loss {losses[0]:.6f}, compiled loss {losses[1]:.6f}")
        if abs(losses[0] - losses[1]) > 1e-4 * max(1.0, abs(losses[0])):
            fail(f"step {step}: compiled loss {losses[1]} differs from eager {losses[0]}")
    print(
        f"compiled training on {device} matched eager for {opts.steps} steps "
        f"({time.perf_counter() - start:.1f} s, compilation included)"
    )
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        if b.device.type != device:
            fail(f"{name} left the device: {b.device}")
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=f"weights of {name} differ")

    def f(a, b):
        z = (a.sin() * b + 1).tanh()
        return z.sum(dim=1), z.amax()

    a, b = torch.randn(64, 128, device=device), torch.randn(64, 128, device=device)
    mod.reset_fallback_counts()
    want = f(a, b)
    eager_fallback = sorted(mod.fallback_counts())
    fused = torch.compile(f, fullgraph=True)
    fused(a, b)  # compiles
    mod.reset_fallback_counts()
    got = fused(a, b)
    compiled_fallback = sorted(mod.fallback_counts())
    for g, w in zip(got, want, strict=True):
        if g.device.type != device:
            fail(f"the compiled function returned a tensor on {g.device}")
        # a float32 sum of 128 values in another order (Inductor's loop against ATen's cascade sum)
        # may differ by ~1e-5 of the sum: one CI run on a loaded machine saw 1.2e-5 in one row of
        # 64, which six runs here did not reproduce
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    print(
        f"sin * b + 1, tanh, sum, amax: eager ran {', '.join(eager_fallback) or 'nothing'} on the CPU fallback; "
        f"compiled: {', '.join(compiled_fallback) or 'nothing'} (fused kernels on the device)"
    )
    if compiled_fallback:
        fail("the compiled function reached the CPU fallback")
    print("ok: torch.compile works on the device")


if __name__ == "__main__":
    main()
