"""Start a multi-process job on one machine, each rank a fresh interpreter on its own device, and
bring it down as soon as one rank fails or the time runs out — a failing rank fails the job, it
never hangs it.

The ranks get the environment torchrun gives them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so the same script runs under either: `run(["-m", "tests.distributed.worker", "ddp"], 2)`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEVICE_COUNT_VAR = "{{ cookiecutter.DEVICE }}_DEVICE_COUNT"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Rank:
    rank: int
    returncode: int | None  # None: killed (another rank failed, or the time ran out)
    output: str


@dataclass
class Job:
    ranks: list[Rank]
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    def report(self) -> str:
        head = f"{len(self.ranks)} ranks, {self.seconds:.1f} s" + (", TIMED OUT" if self.timed_out else "")
        parts = [head] + [f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output}" for r in self.ranks]
        return "\n".join(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(world_size: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    if int(env.get(DEVICE_COUNT_VAR) or 0) < world_size:
        env[DEVICE_COUNT_VAR] = str(world_size)  # one device per rank
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra or {})
    return env


def run(args: list[str], world_size: int, timeout: float = 180, env: dict | None = None) -> Job:
    """Run `python ARGS` as `world_size` ranks; kill them all at the first failure or after `timeout` s."""
    base = environment(world_size, env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    start = time.monotonic()
    procs, logs = [], []
    for rank in range(world_size):
        log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty rank cannot block on it
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
        procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, env=rank_env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
        logs.append(log)
    timed_out = False
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        timed_out = time.monotonic() - start > timeout
        if failed or timed_out:
            break
        time.sleep(0.1)
    killed = set()
    for p in procs:
        if p.poll() is None:
            killed.add(p.pid)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    ranks = []
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        ranks.append(Rank(rank, None if p.pid in killed else p.returncode, log.read()))
        log.close()
    return Job(ranks, time.monotonic() - start, timed_out)
