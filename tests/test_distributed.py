"""The collective backend every generated project carries (csrc/distributed/process_group.cpp, a
c10d Backend registered by {package}/distributed.py) and `backendgen test --distributed`: the
project's multi-process tests on the session's backend — every collective on 2 and 4 processes,
DDP, FSDP2 (of a device module, of a CPU module, in bf16), SyncBatchNorm, tensor parallelism and a
distributed checkpoint each equal to one CPU process's step, mismatched collectives detected
under TORCH_DISTRIBUTED_DEBUG=DETAIL, a failing rank, torchrun running the example of the project's
docs/distributed.md — and its tests of device tensors shared through torch.multiprocessing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import run_cli

DISTRIBUTED_TESTS = [
    "test_two_processes_collectives_and_training",
    "test_four_processes_under_debug_detail",
    "test_a_failing_rank_fails_the_job_without_a_hang",
    "test_torchrun_trains_the_example",
]
# tests/distributed/test_ipc.py: device tensors through torch.multiprocessing, each with spawn and forkserver
IPC_TESTS = [
    f"{name}[{method}]"
    for name in (
        "test_a_child_writes_the_parents_tensor_in_place",
        "test_the_parent_keeps_a_childs_tensor_after_the_child_exits",
        "test_the_sender_keeps_a_block_a_receiver_holds_then_frees_it",
        "test_hogwild_training_updates_the_shared_parameters",
        "test_dataloader_workers_return_device_tensors",
    )
    for method in ("spawn", "forkserver")
]


def test_the_generated_backend_passes_its_distributed_tests(opt_in_run):
    out, logs, _ = opt_in_run
    text = logs["distributed"]
    assert "project tests: passed" in out.stdout and "multi-process tests: passed" in out.stdout, (
        out.stdout + out.stderr + text[-6000:]
    )
    # all ran (none skipped or deselected) and passed
    expected = len(DISTRIBUTED_TESTS) + len(IPC_TESTS)
    assert re.search(rf"\b{expected} passed\b", text) and "skipped" not in text, text[-3000:]


def test_distributed_needs_a_project_with_multi_process_tests(project_copy):
    shutil.rmtree(project_copy / "tests" / "distributed")
    out = run_cli("test", "--distributed", "--project", str(project_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "has no multi-process tests (tests/distributed, template 6 and later)" in out.stdout + out.stderr


def test_the_distributed_tests_are_opt_in(built_project):
    """The project's default pytest run (the one `backendgen new` and `build --test` run) leaves
    the multi-process tests out; `-m distributed` selects exactly them."""

    def collected(*args):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
            cwd=built_project,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [ln for ln in proc.stdout.splitlines() if "::" in ln]

    default = collected()
    assert default and not [t for t in default if t.startswith("tests/distributed/")], default
    assert any(t.startswith("tests/test_distributed.py::") for t in default)  # the quick, single-process ones
    opted = collected("-m", "distributed")
    assert sorted(t.rsplit("::", 1)[1] for t in opted) == sorted(DISTRIBUTED_TESTS + IPC_TESTS), opted
