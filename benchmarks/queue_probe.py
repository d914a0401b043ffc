"""Whether a call waits for the stream: its host time with work queued before it.

    python benchmarks/queue_probe.py        # in the environment of a built backend

Each call is made six times in a row, each time right after eight 800x800 matrix products were
queued on the device's stream: a call that waits for the stream takes the queue's time, a launch
returns in a fraction of a millisecond. Through the CPU fallback the first calls of an operator run
synchronously (its first sight, then the call that judges its meta kernel), so read the last
three. Prints milliseconds; nothing is asserted (docs/performance.md).
"""

from __future__ import annotations

import time

import torch

DEV = torch._C._get_privateuse1_backend_name()
MOD = getattr(torch, DEV)


def host_ms(fn, calls: int = 6) -> list[float]:
    a = torch.randn(800, 800, device=DEV)
    out = []
    for _ in range(calls):
        MOD.synchronize()
        for _ in range(8):
            a @ a
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
        MOD.synchronize()
    return out


def main() -> None:
    r, th = torch.rand(64, 64, device=DEV), torch.randn(64, 64, device=DEV)
    x = torch.randn(64, 64, device=DEV)
    cases = {
        "torch.eye(64)": lambda: torch.eye(64, device=DEV),
        "torch.polar": lambda: torch.polar(r, th),
        "tanh(out=empty(0))": lambda: torch.tanh(x, out=torch.empty(0, device=DEV)),
        # the default add-op kernels of structured operators
        "sum(out=empty(0))": lambda: torch.sum(x, 1, out=torch.empty(0, device=DEV)),
        "mm(out=empty(0))": lambda: torch.mm(x, x, out=torch.empty(0, device=DEV)),
        "torch.sigmoid": lambda: torch.sigmoid(x),
        "torch.arange(64)": lambda: torch.arange(64, device=DEV),
        "torch.tril_indices": lambda: torch.tril_indices(64, 64, device=DEV),
    }
    for name, fn in cases.items():
        print(f"{name:22s}", " ".join(f"{v:8.2f}" for v in host_ms(fn)))


if __name__ == "__main__":
    main()
