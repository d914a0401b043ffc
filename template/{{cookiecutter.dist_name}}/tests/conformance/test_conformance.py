"""The conformance suite as a pytest test, opt-in: `pytest -m conformance` (about a minute on 2
cores). Plain `pytest` deselects it (pyproject.toml's addopts). More dtypes or samples:

    {{ cookiecutter.DEVICE }}_CONFORMANCE_ARGS="--dtype float32 --dtype int64 --samples 5" pytest -m conformance -s

or run the runner itself: python -m tests.conformance.runner --help
"""

import os
import shlex
import subprocess
import sys

import pytest

from tests.conformance.runner import ROOT

ARGS_VARIABLE = "{{ cookiecutter.DEVICE }}_CONFORMANCE_ARGS"


@pytest.mark.conformance
def test_device_matches_cpu_on_the_opinfo_database():
    args = shlex.split(os.environ.get(ARGS_VARIABLE, ""))
    # the runner prints one summary line per variant and the first failure of each op (shown with -s,
    # or below when the test fails)
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.runner", *args], cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, "the conformance suite failed: see its output above (unexpected failures are the FAIL lines)"
