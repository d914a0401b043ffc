"""backendgen's performance figures (issue #6): run them, print a table, write JSON.

    python benchmarks/run.py [--runs 3] [--json benchmarks/results/latest.json] [--no-instructions]
    python benchmarks/run.py --compile-only     # torch.compile's figures alone (about a minute)
    python benchmarks/run.py --only small,fallback   # issue #31's two ratios alone (a build and seconds)
    python benchmarks/run.py --only training         # issue #44's three training steps (a build and a minute)
    python benchmarks/run.py --only loop             # issue #44's edit loop: cold build, new, add-op (minutes)
    python benchmarks/run.py --only graphs           # issue #45's two graph figures (a build and seconds)

Each figure is the median of --runs runs; ratios are measured side by side in the same process.
Where valgrind is installed, the small-op comparison and the render are also counted in
instructions (callgrind), which unlike seconds do not depend on what else the machine is doing.
The script generates its own backend under a fresh name in a temporary directory, installs it
(editable) for the duration of the run and uninstalls it afterwards. Timings are never asserted
by the unit tests: machines are noisy; this script is where the numbers come from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

TARGETS = {
    "help_s": 0.3,
    "render_s": 1.0,
    "cold_build_s": 30.0,
    "cold_build_ext_s": 20.0,
    "noop_rebuild_s": 3.0,
    "edit_rebuild_s": 10.0,
    "add_op_s": 8.0,
    "new_s": 45.0,
    "check_s": 3.0,
    "small_op_ratio": 1.5,
    "small_op_roundtrip_ratio": 1.3,
    "synced_op_ratio": 1.3,
    "fallback_large_op_ratio": 2.0,
    "large_op_ratio": 1.1,
    "compile_pointwise_ratio": 0.7,
    "train_gpt2_ratio": 1.2,
    "train_resnet18_ratio": 1.2,
    "train_lstm_ratio": 1.5,
    "graph_chain_ratio": 0.5,
    "graph_mlp_step_ratio": 1.0,
}


def _time(cmd, cwd=None, env=None) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(
            f"benchmark command failed: {' '.join(map(str, cmd))}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        )
    return elapsed


def _median(f, runs):
    return statistics.median(f() for _ in range(runs))


def _bg(*args):
    return [sys.executable, "-m", "backendgen", *args]


def ninja_tu_times(root: Path) -> dict[str, float]:
    """Seconds per object file from ninja's log of the last build."""
    times = {}
    for log in root.glob("build/**/.ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start, end, _, target, _ = line.split("\t")
            times[Path(target).name] = (int(end) - int(start)) / 1000
    return times


# The start of each program below: `ratio(a, b, number)` times a and b in alternation and returns
# the median of the pairs' (a/b, a per call, b per call). The machine's speed drifts over seconds,
# and a ratio of two separate blocks would measure the drift.
_RATIO = """
import json, sys, timeit, torch
dev = sys.argv[1]
def ratio(fn_a, fn_b, number, repeat=9):
    fn_a(), fn_b()
    pairs = []
    for _ in range(repeat):
        a = timeit.timeit(fn_a, number=number)
        b = timeit.timeit(fn_b, number=number)
        pairs.append((a / b, a / number, b / number))
    return sorted(pairs)[repeat // 2]
"""

DEVICE_BENCH = _RATIO + textwrap.dedent(
    """
    a, b = torch.randn(16), torch.randn(16)
    ad, bd = a.to(dev), b.to(dev)
    small = ratio(lambda: ad + bd, lambda: a + b, 20000)
    A, B = torch.randn(16 * 1024 * 1024), torch.randn(16 * 1024 * 1024)
    Ad, Bd = A.to(dev), B.to(dev)
    large_add = ratio(lambda: Ad + Bd, lambda: A + B, 5)
    large_mul = ratio(lambda: Ad.mul_(1.0), lambda: A.mul_(1.0), 5)
    x = torch.randn(4096); xd = x.to(dev)
    fallback = ratio(lambda: torch.sin(xd), lambda: torch.sin(x), 2000)
    print(json.dumps({"small_op_ratio": small[0], "small_op_device_us": small[1] * 1e6,
                      "small_op_cpu_us": small[2] * 1e6, "large_op_ratio": max(large_add[0], large_mul[0]),
                      "large_add_ratio": large_add[0], "large_mul_ratio": large_mul[0], "fallback_ratio": fallback[0],
                      "fallback_device_us": fallback[1] * 1e6, "fallback_cpu_us": fallback[2] * 1e6}))
    """
)


# Issue #44's three training steps: AdamW on models built from configs, the step timed on the
# device (synchronized) against the same model on the CPU, in alternation. A GPT-2 (2 layers, n_embd
# 128, 4 heads, batch 8x64), a ResNet-18 (torchvision's layout: BasicBlocks 2-2-2-2, batch 8 at
# 64x64; torchvision itself does not load beside the CPU torch) and a 2-layer LSTM (hidden 128,
# batch 16, 32 steps): the LSTM's cells and elementwise gates are what a per-call wait for the stream
# slows down most.
TRAINING = textwrap.dedent(
    """
    import copy
    import torch.nn as nn
    import torch.nn.functional as F

    class GPTBlock(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), heads
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, vocab=1024, ctx=64, d=128, layers=2, heads=4):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.Sequential(*[GPTBlock(d, heads) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.blocks(self.wte(idx) + self.wpe(pos))
            return F.linear(self.ln(x), self.wte.weight)

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    def resnet18(classes=1000):
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))

    class LSTMModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = nn.LSTM(64, 128, num_layers=2, batch_first=True), nn.Linear(128, 64)
        def forward(self, x):
            return self.head(self.lstm(x)[0])

    def training_ratios(dev, dev_sync):
        torch.manual_seed(0)
        cases = {
            "gpt2": (GPT(), torch.randint(0, 1024, (8, 64)),
                     lambda out, x: F.cross_entropy(out.flatten(0, 1), x.flatten())),
            "resnet18": (resnet18(), torch.randn(8, 3, 64, 64),
                         lambda out, x: F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long,
                                                                           device=out.device))),
            "lstm": (LSTMModel(), torch.randn(16, 32, 64), lambda out, x: F.mse_loss(out, x)),
        }
        figures = {}
        for name, (model, x, loss_fn) in cases.items():
            def stepper(device, sync):
                m = copy.deepcopy(model).to(device)
                opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
                inp = x.to(device)
                def step():
                    opt.zero_grad(set_to_none=True)
                    loss_fn(m(inp), inp).backward()
                    opt.step()
                    sync()
                return step
            r = ratio(stepper(dev, dev_sync), stepper("cpu", lambda: None), 3, repeat=7)
            figures.update({f"train_{name}_ratio": r[0], f"train_{name}_device_ms": r[1] * 1e3,
                            f"train_{name}_cpu_ms": r[2] * 1e3})
        return figures
    """
)


# Issue #31's two figures, side by side in one process; argv[2] names the parts to run (small,fallback).
# small: `a + b` on 16 floats, 10,000 of them with a synchronize after every 1,000 — the launch, the
# queue and the wait included, where small_op_ratio above times the launches alone — against the
# same loop on CPU tensors. fallback: torch.atan2 on two 1M-float tensors, an operator no fresh
# backend has a kernel for (it is in no default list of template.json), so it runs through the CPU
# fallback: its staging copies in and out and the CPU kernel, against the CPU kernel alone. The
# same ratio with one intra-op thread on both sides has no target but moves less when other work
# loads the machine (a CPU kernel split over two threads waits for the slower one; the staging
# copies run on one thread either way). erfinv, one input and a slow scalar kernel, is the
# friendlier case and has no target.
# Issue #45's two figures. graph_chain: 200 small-tensor operators (16 floats: native add and mul,
# CPU-fallback sin), replayed from a torch.accelerator.Graph against the same chain run eagerly on
# the device, each synchronized. graph_mlp_step: a captured AdamW (capturable) training step of a
# small MLP (64x256 -> 512 -> 256, GELU) replayed on the device against the same eager step on the
# CPU.
GRAPHS = textwrap.dedent(
    """
    def graph_figures(dev, dev_sync):
        a = torch.randn(16, device=dev)
        def chain():
            y = a
            for i in range(50):
                y = (y * 0.5 + 1.0).sin() + a
            return y
        for _ in range(3):
            chain()
        side = torch.Stream(device=dev)
        side.wait_stream(torch.accelerator.current_stream())
        g = torch.accelerator.Graph()
        with side, g:
            chain()
        figures = {}
        r = ratio(lambda: (g.replay(), dev_sync()), lambda: (chain(), dev_sync()), 20)
        figures.update({"graph_chain_ratio": r[0], "graph_chain_replay_ms": r[1] * 1e3,
                        "graph_chain_eager_ms": r[2] * 1e3})
        torch.manual_seed(0)
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
        cpu_model = mlp()
        dev_model = copy.deepcopy(cpu_model).to(dev)
        x, t = torch.randn(64, 256), torch.randn(64, 256)
        xd, td = x.to(dev), t.to(dev)
        def stepper(m, opt, inp, target):
            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(m(inp), target).backward()
                opt.step()
            return step
        cpu_step = stepper(cpu_model, torch.optim.AdamW(cpu_model.parameters(), lr=1e-3), x, t)
        dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-3, capturable=True)
        dev_step = stepper(dev_model, dev_opt, xd, td)
        with side:
            for _ in range(3):
                dev_step()
        torch.accelerator.current_stream().wait_stream(side)
        dev_opt.zero_grad(set_to_none=True)
        gs = torch.accelerator.Graph()
        with side, gs:
            F.mse_loss(dev_model(xd), td).backward()
            dev_opt.step()
        r = ratio(lambda: (gs.replay(), dev_sync()), cpu_step, 5, repeat=7)
        figures.update({"graph_mlp_step_ratio": r[0], "graph_mlp_step_replay_ms": r[1] * 1e3,
                        "graph_mlp_step_cpu_ms": r[2] * 1e3})
        return figures
    """
)


ASYNC_BENCH = (
    _RATIO
    + TRAINING
    + GRAPHS
    + textwrap.dedent(
        """
    parts = sys.argv[2].split(",")
    dev_sync, cpu_sync = getattr(torch, dev).synchronize, torch.cpu.synchronize
    out = {}
    def roundtrip(x, y, sync, n=10_000, every=1_000):
        def run():
            for _ in range(n // every):
                for _ in range(every):
                    x + y
                sync()
        return run
    if "small" in parts:
        a, b = torch.randn(16), torch.randn(16)
        ad, bd = a.to(dev), b.to(dev)
        rt = ratio(roundtrip(ad, bd, dev_sync), roundtrip(a, b, cpu_sync), 1)
        out.update({"small_op_roundtrip_ratio": rt[0], "small_op_roundtrip_device_us": rt[1] / 10_000 * 1e6,
                    "small_op_roundtrip_cpu_us": rt[2] / 10_000 * 1e6})
        # one `x + 1` and a synchronize per round trip: the launch, the worker, the wait
        def synced(x, sync, n=2_000):
            def run():
                for _ in range(n):
                    x + 1
                    sync()
            return run
        one = ratio(synced(ad, dev_sync), synced(a, cpu_sync), 1)
        out.update({"synced_op_ratio": one[0], "synced_op_device_us": one[1] / 2_000 * 1e6,
                    "synced_op_cpu_us": one[2] / 2_000 * 1e6})
    if "fallback" in parts:
        x, y = torch.randn(1 << 20), torch.randn(1 << 20)
        xd, yd = x.to(dev), y.to(dev)
        fb = ratio(lambda: (torch.atan2(xd, yd), dev_sync()), lambda: torch.atan2(x, y), 20)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        fb1 = ratio(lambda: (torch.atan2(xd, yd), dev_sync()), lambda: torch.atan2(x, y), 20)
        torch.set_num_threads(threads)
        u = torch.rand(1 << 20) * 1.8 - 0.9
        ud = u.to(dev)
        fe = ratio(lambda: (torch.erfinv(ud), dev_sync()), lambda: torch.erfinv(u), 5)
        out.update({"fallback_large_op_ratio": fb[0], "fallback_large_op_device_ms": fb[1] * 1e3,
                    "fallback_large_op_cpu_ms": fb[2] * 1e3, "fallback_large_op_1thread_ratio": fb1[0],
                    "fallback_erfinv_ratio": fe[0]})
    if "training" in parts:
        out.update(training_ratios(dev, dev_sync))
    if "graphs" in parts:
        out.update(graph_figures(dev, dev_sync))
    print(json.dumps(out))
    """
    )
)

COMPILE_BENCH = _RATIO + textwrap.dedent(
    """
    # compiled against eager on the device
    sync = getattr(torch, dev).synchronize
    def chain(x):
        return ((x * 2 + 1).sin() * x.cos() - x.tanh()).relu() + 0.5
    x = torch.randn(1 << 20, device=dev)
    fused = torch.compile(chain, fullgraph=True)
    pointwise = ratio(lambda: (fused(x), sync()), lambda: (chain(x), sync()), 20)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                              torch.nn.Linear(512, 256)).to(dev)
    inp = torch.randn(64, 256, device=dev)
    compiled_mlp = torch.compile(mlp, fullgraph=True)
    with torch.no_grad():
        mlp_r = ratio(lambda: (compiled_mlp(inp), sync()), lambda: (mlp(inp), sync()), 50)
    print(json.dumps({"compile_pointwise_ratio": pointwise[0], "compile_pointwise_ms": pointwise[1] * 1e3,
                      "eager_pointwise_ms": pointwise[2] * 1e3, "compile_mlp_ratio": mlp_r[0],
                      "compile_mlp_ms": mlp_r[1] * 1e3, "eager_mlp_ms": mlp_r[2] * 1e3}))
    """
)


INSTR_BENCH = textwrap.dedent(
    """
    import os, subprocess, sys, torch
    dev, side, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    a, b = torch.randn(16), torch.randn(16)
    if side == "device":
        a, b = a.to(dev), b.to(dev)
    a + b
    # instrument only from here: import torch under valgrind is what costs minutes
    subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True, capture_output=True)
    for _ in range(n):
        a + b
    """
)


def small_op_instructions(device: str, env: dict, n: int = 2000) -> dict[str, float]:
    """Instructions per 16-float `a + b` from Python's `+` down (callgrind counts only inside
    THPVariable_add), on the device and on the CPU. Empty without valgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return {}
    per_op = {}
    for side in ("device", "cpu"):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "callgrind.out"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--instr-atstart=no",
                    "--toggle-collect=torch::autograd::THPVariable_add(*",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    "-c",
                    INSTR_BENCH,
                    device,
                    side,
                    str(n),
                ],
                env=env,
                capture_output=True,
                check=True,
            )
            totals = [line for line in out.read_text().splitlines() if line.startswith(("totals:", "summary:"))]
            per_op[side] = int(totals[-1].split()[1]) / n
    return {
        "small_op_instr_device": per_op["device"],
        "small_op_instr_cpu": per_op["cpu"],
        "small_op_instr_ratio": per_op["device"] / per_op["cpu"],
    }


def render_instructions(device: str, work: Path, env: dict) -> dict[str, float]:
    """Instructions of a whole `backendgen new --no-build` (interpreter start included), in
    billions: the render figure without the machine's mood. Empty without valgrind."""
    if shutil.which("valgrind") is None:
        return {}
    dest = work / f"i{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                *_bg("new", device + "i", "-o", str(dest), "--no-build"),
            ],  # not the installed one's name
            env=env,
            capture_output=True,
            check=True,
        )
        totals = [line for line in out.read_text().splitlines() if line.startswith(("totals:", "summary:"))]
    shutil.rmtree(dest, ignore_errors=True)
    return {"render_instr_G": int(totals[-1].split()[1]) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "latest.json")
    ap.add_argument(
        "--no-instructions", action="store_true", help="skip the callgrind counts (about a minute and a half)"
    )
    ap.add_argument(
        "--compile-only",
        action="store_true",
        help="only torch.compile's figures: compiled vs eager on the device (a build and a minute)",
    )
    ap.add_argument(
        "--only",
        metavar="PARTS",
        type=_parts,
        help="only these figures, comma-separated: small (the small-op round trips), "
        "fallback (a 1M-float operator through the CPU fallback), training (AdamW steps of a GPT-2, a ResNet-18 "
        "and an LSTM), loop (cold build, new, add-op), graphs (a replayed chain, a replayed training step); a build "
        "and seconds (training: a minute; loop: minutes)",
    )
    args = ap.parse_args()
    device = "bench" + uuid.uuid4().hex[:6].translate(str.maketrans("0123456789", "ghijklmnop"))
    work = Path(tempfile.mkdtemp(prefix="backendgen-bench-"))
    root = work / "proj"
    res: dict[str, float] = {}
    env = dict(os.environ)
    tu: dict[str, float] = {}
    try:
        if args.compile_only:
            _time(_bg("new", device, "-o", str(root)))
            res.update(_device_figures(COMPILE_BENCH, device, env))
        elif args.only:
            if "loop" in args.only:
                loop, tu = _loop_figures(device, work, env)
                res.update(loop)
            device_parts = [p for p in args.only if p != "loop"]
            if device_parts:
                if not (root / "backendgen.json").exists():
                    _time(_bg("new", device, "-o", str(root), "--no-test"))
                res.update(_device_figures(ASYNC_BENCH, device, env, ",".join(device_parts)))
        else:
            # the machine's speed today: every figure below scales with these (none has a target)
            res["ref_python_start_s"] = _median(lambda: _time([sys.executable, "-c", "pass"]), 5)
            res["ref_import_torch_s"] = _median(
                lambda: _time([sys.executable, "-c", "import torch"], env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")),
                3,
            )
            res["help_s"] = _median(lambda: _time(_bg("--help")), max(args.runs, 5))

            def render():
                d = work / f"r{uuid.uuid4().hex[:6]}"
                t = _time(_bg("new", device, "-o", str(d), "--no-build"))
                shutil.rmtree(d)
                return t

            res["render_s"] = _median(render, args.runs)

            # cold build without ccache, so it is the compiler's time
            _time(_bg("new", device, "-o", str(root), "--no-build"))
            cold_env = dict(env, BACKENDGEN_NO_CCACHE="1", TORCH_NO_COMPILER_WRAPPER="1")
            t0 = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"from backendgen.toolchain import build; from pathlib import Path; "
                    f"build.build(Path({str(root)!r}), 'torch_{device}', 'torch-{device}', incremental=False)",
                ],
                env=cold_env,
                check=True,
            )
            res["cold_build_s"] = time.perf_counter() - t0
            # the compile alone, without pip's own work: setup.py from a clean build/ (ninja's log
            # then gives the time of each translation unit)
            shutil.rmtree(root / "build", ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "setup.py", "build_ext", "--inplace"],
                cwd=root,
                env=dict(cold_env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
                check=True,
                capture_output=True,
            )
            res["cold_build_ext_s"] = time.perf_counter() - t0
            tu = ninja_tu_times(root)

            # what a user runs after an edit; ccache on, as backendgen sets it up. The first rebuild is
            # not a figure: the cold build_ext above ran without backendgen, which keeps no record of
            # it, so that rebuild goes through setup.py; later ones run ninja and the link alone.
            rebuild = _bg("build", "--project", str(root))
            _time(rebuild)
            res["noop_rebuild_s"] = _median(lambda: _time(rebuild), args.runs)

            kernel = root / "csrc" / "aten" / "ops" / "mul.cpp"
            original = kernel.read_text()

            def edit():
                # a change to the code, not a comment: ccache would serve a comment-only edit from its cache
                tag = uuid.uuid4().hex[:12]
                kernel.write_text(original + f"\nnamespace {{ [[maybe_unused]] int edit_{tag} = 1; }}\n")
                return _time(rebuild)

            res["edit_rebuild_s"] = _median(edit, args.runs)
            kernel.write_text(original)
            _time(rebuild)

            res["add_op_s"] = _time(_bg("add-op", "abs.out", "--project", str(root)))
            res["check_s"] = _median(lambda: _time(_bg("check", "--project", str(root))), args.runs)

            res.update(_device_figures(DEVICE_BENCH, device, env))
            res.update(_device_figures(ASYNC_BENCH, device, env, "small,fallback,training"))
            res.update(_device_figures(COMPILE_BENCH, device, env))
            if not args.no_instructions:
                res.update(small_op_instructions(device, env))
                res.update(render_instructions(device, work, env))
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", f"torch-{device}"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    _report(res, tu, args.json)


ASYNC_PARTS = ("small", "fallback", "training", "loop", "graphs")


def _loop_figures(device: str, work: Path, env: dict) -> tuple[dict[str, float], dict[str, float]]:
    """Issue #44's edit loop as a user meets it: a cold build from an empty build/ with ccache off
    (setup.py build_ext, two compile jobs; each unit's seconds from ninja's log), `backendgen new`
    (render, build with ccache as backendgen sets it up, the quick suite) into work/proj, which stays
    installed, an add-op round trip there (aten::abs.out: render, rebuild, its tests) and the rebuild
    after an edit of that kernel."""
    res: dict[str, float] = {}
    cold = work / "cold"
    _time(_bg("new", device, "-o", str(cold), "--no-build"))
    cold_env = dict(
        env,
        CCACHE_DISABLE="1",
        BACKENDGEN_NO_CCACHE="1",
        TORCH_NO_COMPILER_WRAPPER="1",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        MAX_JOBS="2",
    )
    res["cold_build_ext_s"] = _time([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=cold, env=cold_env)
    tu = ninja_tu_times(cold)
    res["cold_build_units_sum_s"] = sum(tu.values())
    shutil.rmtree(cold, ignore_errors=True)
    proj = work / "proj"
    res["new_s"] = _time(_bg("new", device, "-o", str(proj)))
    res["add_op_s"] = _time(_bg("add-op", "aten::abs.out", "--project", str(proj)))
    kernel = next((proj / "csrc" / "aten" / "ops").glob("abs*.cpp"))
    tag = uuid.uuid4().hex[:8]  # a change to the code: ccache would serve a comment's from its cache
    kernel.write_text(kernel.read_text() + f"\nnamespace {{ [[maybe_unused]] int edit_{tag} = 1; }}\n")
    res["edit_rebuild_s"] = _time(_bg("build", "--project", str(proj)))
    return res, tu


def _parts(value: str) -> list[str]:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in parts if p not in ASYNC_PARTS]
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(ASYNC_PARTS)}, got {value!r}")
    return parts


def _device_figures(program: str, device: str, env: dict, *extra: str) -> dict[str, float]:
    """Run one of the programs above on the installed backend; its last line is the JSON of its figures."""
    out = subprocess.run([sys.executable, "-c", program, device, *extra], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _report(res: dict, tu: dict, json_path: Path) -> None:
    print(f"{'figure':<30}{'measured':>12}{'target':>10}")
    for k, v in res.items():
        target = TARGETS.get(k)
        mark = "" if target is None else ("  ok" if v <= target else "  MISSED")
        print(f"{k:<30}{v:>12.3f}{'' if target is None else f'{target:>10.2f}'}{mark}")
    if tu:
        print("\nper translation unit (cold build, s):")
        for name, secs in sorted(tu.items(), key=lambda kv: -kv[1]):
            print(f"  {secs:7.1f}  {name}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"figures": res, "targets": TARGETS, "translation_units": tu}, indent=2))
    print(f"\nwritten {json_path}")


if __name__ == "__main__":
    main()
