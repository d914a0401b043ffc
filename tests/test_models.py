"""The model suite every generated project carries (tests/models): real architectures trained on
the device and on the CPU from the same weights, eager and compiled, run by
`backendgen test --models` on the session's backend."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import run_cli

from backendgen.project import manifest

MODEL_TESTS = manifest.load().path("model_tests")  # where the current template puts it


def test_the_generated_backend_passes_its_model_suite(built_project, opt_in_run):
    out, logs, _ = opt_in_run
    text = logs["models"]
    assert "model suite: passed" in out.stdout, out.stdout + out.stderr + text[-6000:]
    summary = text.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "models", MODEL_TESTS],
        cwd=built_project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    total = int(re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", collected.stdout).group(1))
    assert passed >= 30, summary
    # every test ran and passed, but those of a third-party package this environment lacks
    skipped = int(m.group(1)) if (m := re.search(r"(\d+) skipped", summary)) else 0
    assert passed + skipped == total and "failed" not in summary and "error" not in summary, summary
    skips = re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", text, re.M)  # pytest -rs
    assert sum(int(n) for n, _ in skips) == skipped, text[-3000:]
    assert all(reason.endswith("is not installed") for _, reason in skips), skips
    # the quick suite (what `new` and `build --test` run) leaves the model suite out
    assert re.search(r"\d+ deselected", logs["test"])


def test_models_needs_a_project_with_a_model_suite(project_copy):
    shutil.rmtree(project_copy / MODEL_TESTS)
    out = run_cli("test", "--models", "--project", str(project_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "has no model suite (tests/models, template 9 and later)" in out.stdout + out.stderr
