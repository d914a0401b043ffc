"""Long commands show their progress live on a terminal and plain lines elsewhere (cli/progress.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import run_cli

from backendgen.plumbing.progress import Watch, Watcher

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_in_terminal(*args: str, cwd: Path) -> tuple[int, str]:
    """`backendgen ARGS` with stdout and stderr on a pseudo-terminal, as in a user's terminal."""
    master, slave = os.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "backendgen", *args], cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=600), b"".join(chunks).decode("utf-8", "replace")


def _touch_a_kernel_source(root: Path) -> None:
    source = sorted((root / "csrc" / "aten").rglob("*.cpp"))[0]
    later = time.time() + 1
    os.utime(source, (later, later))  # ninja compiles its unit again


def test_a_terminal_sees_the_build_live_and_a_pipe_gets_the_plain_line(installed):
    _touch_a_kernel_source(installed)
    rc, shown = _run_in_terminal("build", "--project", str(installed), cwd=installed)
    assert rc == 0, shown
    plain = ANSI.sub("", shown)
    # the live line, redrawn while the step runs: the step and its elapsed time
    assert re.search(r"build 0:\d\d", plain), shown
    # then the step's line, with ninja's count of the units it compiled
    done = re.search(r"✓ build \d+\.\d s \((\d+)/(\d+) units\)", plain)
    assert done and done.group(1) == done.group(2) and int(done.group(1)) >= 1, shown

    _touch_a_kernel_source(installed)
    piped = run_cli("build", "--project", str(installed))
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert re.search(r"^✓ build \d+\.\d s$", piped.stdout, re.MULTILINE), piped.stdout
    assert "\x1b" not in piped.stdout + piped.stderr and "units" not in piped.stdout


def test_the_tests_are_counted_as_they_run(tmp_path):
    (tmp_path / "test_three.py").write_text(
        textwrap.dedent(
            """
            def test_passes(): pass
            def test_fails(): assert False
            def test_passes_too(): pass
            """
        )
    )
    events = tmp_path / "events"
    watcher = Watcher(Watch(events=events))
    assert watcher.poll().describe() == ""
    env = {**os.environ, "BACKENDGEN_PROGRESS": str(events)}
    env.pop("PYTEST_ADDOPTS", None)
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "backendgen.programs.pytest_progress", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
    )
    assert watcher.poll().describe() == "3/3 tests, 1 failed"


def test_a_build_log_left_by_an_earlier_run_is_not_read_as_this_one(tmp_path):
    log = tmp_path / "backendgen-build.log"
    log.write_text("$ ninja\n[7/7] c++ old.cpp\n")
    old = time.time() - 60
    os.utime(log, (old, old))
    watcher = Watcher(Watch(log=log))
    assert watcher.poll().units is None
    log.write_text("$ ninja\n[1/3] c++ a.cpp\n[2/3] c++ b.cpp\n")
    assert watcher.poll().units == (2, 3)
