"""The edit loop's figures (issue #44): cold build, `backendgen new`, and an add-op round trip.

    python benchmarks/build_loop.py [--jobs 2] [--skip-new] [--keep]

Prints, never asserts (machines are noisy; the figures scale with what else the machine does):
- cold build: a freshly rendered project compiled from an empty build/ with ccache off
  (CCACHE_DISABLE=1, BACKENDGEN_NO_CCACHE=1), `setup.py build_ext --inplace` with --jobs compile
  jobs; then each translation unit's seconds from ninja's log, their sum (the compiler's work),
  and the compiler's CPU seconds (user + sys of the build's child processes);
- `new` total: `backendgen new NAME` as a user runs it (render, build with ccache as backendgen
  sets it up, the quick suite); --skip-new leaves it out;
- add-op round trip: `backendgen add-op aten::abs.out` in that project (render, rebuild, the new
  operator's tests), then the rebuild alone once more after touching the new kernel.

`new` installs the generated backend (editable) into this Python for the run and uninstalls it
afterwards; only one PrivateUse1 backend can be installed per environment, so run it in a venv
without another one (or pass --skip-new: the add-op round trip then is not measured either).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def _bg(*args: str) -> list[str]:
    return [sys.executable, "-m", "backendgen", *args]


def _run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return elapsed


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def ninja_units(root: Path) -> list[tuple[str, float, float, float]]:
    """(object, start s, end s, seconds) of each unit of the last build, from ninja's log."""
    rows = []
    for log in root.glob("build/temp.*/.ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start, end, _, target, _ = line.split("\t")
            rows.append((Path(target).name, int(start) / 1000, int(end) / 1000, (int(end) - int(start)) / 1000))
    return sorted(rows, key=lambda r: r[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="compile jobs of the cold build (MAX_JOBS)")
    ap.add_argument("--skip-new", action="store_true", help="measure the cold build only")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    device = "loop" + uuid.uuid4().hex[:6].translate(str.maketrans("0123456789", "ghijklmnop"))
    work = Path(tempfile.mkdtemp(prefix="backendgen-loop-"))
    env = dict(os.environ)
    installed = False
    try:
        cold = work / "cold"
        _run(_bg("new", device, "-o", str(cold), "--no-build"))
        cold_env = dict(
            env,
            CCACHE_DISABLE="1",
            BACKENDGEN_NO_CCACHE="1",
            TORCH_NO_COMPILER_WRAPPER="1",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0",
            MAX_JOBS=str(args.jobs),
        )
        cpu0 = _children_cpu()
        t = _run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=cold, env=cold_env)
        cpu = _children_cpu() - cpu0
        units = ninja_units(cold)
        print(f"cold build (ccache off, {args.jobs} jobs): {t:.1f} s wall, {cpu:.1f} s CPU of its processes")
        for name, start, end, secs in units:
            print(f"  {name:<28} {secs:6.1f} s  ({start:6.1f} -> {end:6.1f})")
        print(f"  sum of units {sum(u[3] for u in units):.1f} s; last unit ends at {max(u[2] for u in units):.1f} s")
        shutil.rmtree(cold, ignore_errors=True)
        if args.skip_new:
            return

        proj = work / "proj"
        t = _run(_bg("new", device, "-o", str(proj)))
        installed = True
        print(f"new total (render, build with ccache as backendgen sets it up, quick suite): {t:.1f} s")
        t = _run(_bg("add-op", "aten::abs.out", "--project", str(proj)))
        print(f"add-op round trip (aten::abs.out: render, rebuild, its tests): {t:.1f} s")
        kernel = next((proj / "csrc" / "aten" / "ops").glob("abs*.cpp"))
        tag = uuid.uuid4().hex[:8]  # a change to the code: ccache would serve a comment's from its cache
        kernel.write_text(kernel.read_text() + f"\nnamespace {{ [[maybe_unused]] int edit_{tag} = 1; }}\n")
        t = _run(_bg("build", "--project", str(proj)))
        print(f"rebuild after editing that kernel (ccache on, no tests): {t:.1f} s")
    finally:
        if installed:
            subprocess.run(
                [sys.executable, "-m", "pip", "uninstall", "-y", "-q", f"torch-{device}"], capture_output=True
            )
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
