"""What a driver costs on day one (issue #42): a training step and the model suite, on a built project.

    python benchmarks/driver_costs.py PROJECT_DIR [--runs 5] [--no-suite]

Run it once in the environment of an emulator project and once in that of a minimal-driver project
(`backendgen new NAME --driver minimal`; one PrivateUse1 backend per environment), and compare: the
minimal driver has no host mapping, so every kernel stages its device memory through the driver's
copies. Prints the device's capabilities, the median time of one training step of a small conv net
and of a small MLP on the device and on the CPU (their ratio), and the wall time of the project's model
suite (`pytest -m models tests/models`). Figures only: nothing is asserted (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

STEP = r"""
import json, statistics, sys, time, torch
dev = torch._C._get_privateuse1_backend_name()
mod = getattr(torch, dev)
runs = int(sys.argv[1])

def models():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return {"conv net (8x3x32x32)": (conv, torch.randn(8, 3, 32, 32)), "MLP (64x256)": (mlp, torch.randn(64, 256))}

def step_time(model, x, device):
    model = model.to(device)
    x = x.to(device)
    y = torch.randint(0, 10, (x.shape[0],)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def one():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if device != "cpu":
            mod.synchronize()
    one()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(5):
            one()
        times.append((time.perf_counter() - start) / 5)
    return statistics.median(times)

out = {"capabilities": sorted(mod.capabilities())}
for name, (model, x) in models().items():
    cpu = step_time(model, x, "cpu")
    device = step_time(model, x, dev)
    out[name] = {"cpu_ms": cpu * 1e3, "device_ms": device * 1e3, "ratio": device / cpu}
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("project", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-suite", action="store_true", help="skip the model suite's wall time")
    args = ap.parse_args()
    step = subprocess.run([sys.executable, "-c", STEP, str(args.runs)], capture_output=True, text=True, check=False)
    if step.returncode != 0:
        raise SystemExit(f"the training-step run failed:\n{step.stderr[-3000:]}")
    figures = json.loads(step.stdout.strip().splitlines()[-1])
    print(f"driver capabilities: {', '.join(figures.pop('capabilities')) or '(none)'}")
    for name, f in figures.items():
        print(f"training step, {name}: device {f['device_ms']:.1f} ms, CPU {f['cpu_ms']:.1f} ms, {f['ratio']:.2f}x")
    if not args.no_suite:
        start = time.perf_counter()
        suite = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "models", "tests/models"],
            cwd=args.project,
            capture_output=True,
            text=True,
            check=False,
        )
        last = (suite.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"model suite: {time.perf_counter() - start:.0f} s ({last})")


if __name__ == "__main__":
    main()
