"""Multi-process tests of the {{ cookiecutter.device }} collective backend ({{ cookiecutter.package }}/distributed.py).

Opt-in (`pytest -m distributed`, or `backendgen test --distributed`): each job starts one Python
per rank (torch's import alone is ~2 s each). Every rank runs tests/distributed/worker.py on its own
device; a job is killed at its first failing rank or after its time limit, so a failure
or a hang fails the test within that limit.
"""

import os
import signal
import subprocess
import sys

import pytest

from tests.distributed import launch

pytestmark = pytest.mark.distributed

TIMEOUT = 240  # seconds per job, on a loaded 2-core machine


def run_job(world_size, *scenarios, env=None):
    job = launch.run(["-m", "tests.distributed.worker", *scenarios], world_size, timeout=TIMEOUT, env=env)
    assert job.ok, job.report()
    for rank in job.ranks:
        for name in scenarios:
            assert f"PASSED {name}:" in rank.output, job.report()
    return job


TRAINING = ["ddp", "fsdp", "fsdp_from_cpu", "syncbn", "fsdp_bf16", "tensor_parallel", "checkpoint"]


def test_two_processes_collectives_and_training():
    """Every collective against its definition (six dtypes, sync and async, uneven sizes, object
    collectives), then one training step each of DDP, FSDP2 (a device module, a CPU module, bf16
    mixed precision), SyncBatchNorm in DDP, DTensor with tensor parallelism and a distributed
    checkpoint saved and loaded, each compared with the same step in one CPU process on the whole
    batch. One launch runs them all: starting the ranks costs more than most checks."""
    run_job(2, "collectives", *TRAINING)


def test_four_processes_under_debug_detail():
    """The same at 4 ranks with TORCH_DISTRIBUTED_DEBUG=DETAIL (every collective through c10d's
    checking wrapper), ending with mismatched collectives, which every rank must detect."""
    run_job(4, "collectives", *TRAINING, "mismatch", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


def test_a_failing_rank_fails_the_job_without_a_hang():
    """Rank 1 dies before its first collective; rank 0, waiting in it, is stopped with it."""
    script = (
        "import os, sys, datetime, torch, torch.distributed as dist, {{ cookiecutter.package }}\n"
        "rank = int(os.environ['RANK'])\n"
        "torch.{{ cookiecutter.device }}.set_device(rank)\n"
        "dist.init_process_group(timeout=datetime.timedelta(seconds=600))\n"
        "if rank == 1: sys.exit(3)\n"
        "dist.all_reduce(torch.ones(1, device='{{ cookiecutter.device }}'))\n"
    )
    job = launch.run(["-c", script], 2, timeout=TIMEOUT)
    assert not job.ok and not job.timed_out, job.report()
    assert job.ranks[1].returncode == 3, job.report()
    assert job.ranks[0].returncode != 0, job.report()  # killed (None) or failed: never a success
    assert job.seconds < 120, job.report()


def test_torchrun_trains_the_example():
    """docs/distributed.md's command: torchrun, 2 processes, examples/train_ddp.py."""
    env = launch.environment(2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(launch.free_port()), "examples/train_ddp.py", "--steps", "10"]
    # its own session, so that on a timeout torchrun's workers are killed with it
    proc = subprocess.Popen(cmd, cwd=launch.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s:\n{stdout}\n{stderr}")
    out = stdout + stderr
    assert proc.returncode == 0, out
    assert "done: 2 processes on {{ cookiecutter.device }}, parameters identical on every rank" in out, out
    losses = [float(line.split("loss")[1]) for line in stdout.splitlines() if line.startswith("step")]
    assert len(losses) >= 2 and losses[-1] < losses[0], out
