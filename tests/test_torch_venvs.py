"""tests/torch_venvs.py's hold on a background command: CPU seconds, not wall seconds.

The matrix's commands run at nice 19 behind the session's tests, where a build can wait many minutes
for the CPU; a command is killed for what it uses (a runaway) or for using nothing (a hang), and
what it used is shown in the session's timeline."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from torch_venvs import Overran, wait_measured


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )


def test_a_command_reports_its_output_and_the_cpu_of_its_children():
    # the CPU is used by a child the command starts in a process group of its own (as backendgen
    # runs a build) and reaps: counted while it runs, so a command busy only in its child is no hang
    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 5: pass')"
    proc = _start(
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], process_group=0); print('done')"
    )
    out, err, cpu = wait_measured(proc, cpu_limit=60, stall=2.0)
    assert proc.returncode == 0 and out == "done\n" and err == ""
    assert 4.9 <= cpu < 15


def test_a_runaway_is_killed_past_its_cpu_limit():
    proc = _start("print('started', flush=True)\nwhile True: pass")
    start = time.monotonic()
    with pytest.raises(Overran, match="used more than 2 s of CPU") as caught:
        wait_measured(proc, cpu_limit=2)
    assert proc.returncode == -9 and "started" in caught.value.out
    assert time.monotonic() - start < 120  # killed, not left to run


def test_a_command_that_uses_no_cpu_is_a_hang():
    proc = _start("import time; time.sleep(600)")
    with pytest.raises(Overran, match="used no CPU for 5 s"):
        wait_measured(proc, cpu_limit=60, stall=5.0)
    assert proc.returncode == -9


def test_a_command_another_thread_polls_still_reports_its_outcome():
    # the session's main thread looks at a scenario's command (to renice it) while a background
    # thread waits for it: a Popen.poll() there reaps the process first (CI's failure of 2026-12-07)
    import threading

    proc = _start("import time; time.sleep(1.5); print('done')")
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and proc.poll() is None:
            time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        out, err, _ = wait_measured(proc, cpu_limit=60)
    finally:
        stop.set()
        poller.join()
    assert proc.returncode == 0 and out == "done\n" and err == ""
