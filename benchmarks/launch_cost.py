"""What a small kernel's round trip costs (issue #44): queue it, run it, wait for it — against the CPU.

    python benchmarks/launch_cost.py [--runs 15] [--iters 2000] [--size 16]

Run it in the environment of a built project (its backend installed and autoloaded). It times
`y = x + 1; torch.<device>.synchronize()` on a small device tensor and `y = x + 1` on the same tensor
on the CPU, alternating the two in one process (so both see the same machine load), and prints the
median time of each and the median of the per-round ratios (device / CPU). The path it measures is
the launch path: the generated kernel's host part (device checks, output allocation), the queue to
the stream's worker, the worker running the CPU kernel on host aliases, and the synchronize that
waits for it. Figures only: nothing is asserted (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="alternating rounds (device, then CPU)")
    ap.add_argument("--iters", type=int, default=2000, help="round trips per round")
    ap.add_argument("--size", type=int, default=16, help="elements of the tensor")
    args = ap.parse_args()

    dev = torch._C._get_privateuse1_backend_name()
    if dev == "privateuseone":
        raise SystemExit("no backend is installed in this environment: build a project first (backendgen new NAME)")
    mod = getattr(torch, dev)
    torch.set_num_threads(1)
    x_cpu = torch.randn(args.size)
    x_dev = x_cpu.to(dev)

    def device_round() -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            y = x_dev + 1
            mod.synchronize()
        del y
        return (time.perf_counter() - start) / args.iters

    def cpu_round() -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            y = x_cpu + 1
        del y
        return (time.perf_counter() - start) / args.iters

    device_round(), cpu_round()  # warm up: the worker thread, the allocator's cache, the dispatcher
    dev_times, cpu_times, ratios = [], [], []
    for _ in range(args.runs):
        d, c = device_round(), cpu_round()
        dev_times.append(d)
        cpu_times.append(c)
        ratios.append(d / c)
    print(f"device {dev}: capabilities {', '.join(sorted(mod.capabilities())) or '(none)'}")
    print(f"x + 1 on {args.size} elements, then synchronize: {statistics.median(dev_times) * 1e6:.2f} us")
    print(f"x + 1 on {args.size} elements on the CPU:         {statistics.median(cpu_times) * 1e6:.2f} us")
    print(f"round-trip ratio (median of {args.runs} rounds): {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
