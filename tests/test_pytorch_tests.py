"""`backendgen test --pytorch-tests DIR FILE[=EXPR]...` (backendgen/toolchain/pytorch_tests.py): PyTorch's
device-generic test files on the CPU and on the device, paired and compared.

The runner is exercised without a backend: the test files here are device-generic files in shape only
(plain unittest classes named as `instantiate_device_type_tests` names them, `TestFooCPU` and
`TestFooMYDEV`, with tests `test_add_cpu_float32` and `test_add_mydev_float32`), so the "device" is a
name and its failures, crashes and hangs are written into the file. One slow test runs a real
`instantiate_device_type_tests` file against the session's backend.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from backendgen.toolchain import pytorch_tests as pt

HELPER = """\
def add(a, b):
    return a + b
"""

# A file of both sides. On "mydev": add and after_crash pass; two failures of one cause (numbers,
# addresses and device indices differ); an abort; a skip; a failure the CPU has too (skew); a test
# without a CPU twin (onlyPRIVATEUSE1); a class whose setUpClass raises (an error), named as torch names
# the first device class it makes (PRIVATEUSE1); a CPU test the device has no twin of; a class of
# neither side that must never run.
GENERIC = """\
import os
import unittest

from _helper import add  # a sibling: the runner runs in the file's directory, as PyTorch's tests need


class TestFooCPU(unittest.TestCase):
    def test_add_cpu_float32(self):
        self.assertEqual(add(1, 2), 3)

    def test_b_mismatch_cpu_float32(self):
        pass

    def test_c_crash_cpu(self):
        pass

    def test_d_mismatch_cpu_int64(self):
        pass

    def test_e_skew_cpu(self):
        raise AssertionError("the reference differs on this torch: 1 != 2")

    def test_f_skipped_cpu(self):
        pass

    def test_g_after_crash_cpu(self):
        pass

    def test_h_cpu_only_cpu(self):
        pass


class TestFooMYDEV(unittest.TestCase):
    def test_add_mydev_float32(self):
        self.assertEqual(add(1, 2), 3)

    def test_b_mismatch_mydev_float32(self):
        raise AssertionError("Tensor-likes are not close! at 0x7f3a2b10, mydev:0, index 3\\nmore detail")

    def test_c_crash_mydev(self):
        os.abort()

    def test_d_mismatch_mydev_int64(self):
        raise AssertionError("Tensor-likes are not close! at 0x55aa01, mydev:1, index 17")

    def test_e_skew_mydev(self):
        raise AssertionError("the reference differs on this torch: 1 != 2")

    def test_f_skipped_mydev(self):
        self.skipTest("not supported on mydev")

    def test_g_after_crash_mydev(self):
        pass

    def test_i_device_only_mydev(self):
        raise RuntimeError("only the device has this test")


class TestBarCPU(unittest.TestCase):
    def test_x_cpu(self):
        pass


class TestBarPRIVATEUSE1(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise RuntimeError("mydev:0 could not be initialised")

    def test_x_mydev(self):
        pass


class NotGeneric(unittest.TestCase):
    def test_plain(self):
        raise AssertionError("a class of neither side must not run")
"""

HANG = """\
import time
import unittest


class TestHangCPU(unittest.TestCase):
    def test_a_cpu(self):
        pass

    def test_b_cpu(self):
        pass


class TestHangMYDEV(unittest.TestCase):
    def test_a_mydev(self):
        time.sleep(600)

    def test_b_mydev(self):
        pass
"""

CPU_ONLY = """\
import unittest


class TestLonelyCPU(unittest.TestCase):
    def test_a_cpu(self):
        pass
"""


@pytest.fixture(autouse=True)
def _quick_pytest(monkeypatch):
    """The child pytests load no installed plugins: hypothesis' alone costs a second and a half each."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def tests_dir(tmp_path) -> Path:
    d = tmp_path / "test"
    d.mkdir()
    (d / "_helper.py").write_text(HELPER)
    (d / "test_generic.py").write_text(GENERIC)
    (d / "test_hang.py").write_text(HANG)
    (d / "test_cpu_only.py").write_text(CPU_ONLY)
    return d


def _run(tests_dir: Path, out: Path, *files: str, timeout: float = 120) -> pt.Report:
    specs = pt.parse_files(tests_dir, list(files))
    return pt.run(specs, "mydev", out, tests_dir=tests_dir, timeout=timeout)


def test_a_file_is_paired_counted_and_survives_a_crash(tests_dir, tmp_path):
    report = _run(tests_dir, tmp_path / "out", "test_generic.py")
    f = report.files[0]
    assert f.cpu_passed == 7  # add, b, c, d, f, g and TestBar's x: not the skew, not h (no device twin)
    assert f.on_device == {"passed": 2, "failed": 2, "errored": 1, "skipped": 1, "crashed": 1, "not_run": 0}
    # the crash names the test, and the rest of the file ran (after_crash passed) in a second process
    assert f.crashes == [
        {"side": "mydev", "test": "TestFooMYDEV::test_c_crash_mydev", "message": "the process was killed by SIGABRT"}
    ]
    assert [(r.side, r.attempt) for r in (*f.cpu.runs, *f.dev.runs)] == [("cpu", 0), ("mydev", 0), ("mydev", 1)]
    assert f.dev.outcomes["test_generic.py::TestFooMYDEV::test_g_after_crash_mydev"].status == "passed"
    # skew: failing on the CPU too, reported apart and not counted against the device
    assert f.skew == [
        {
            "test": "TestFooMYDEV::test_e_skew_mydev",
            "cpu": "failed",
            "cpu_message": "AssertionError: the reference differs on this torch: 1 != 2",
            "device": "failed",
        }
    ]
    assert f.device_only == {"passed": 0, "failed": 1, "errored": 0, "skipped": 0, "crashed": 0, "not_run": 0}
    assert f.device_only_failures[0]["test"] == "TestFooMYDEV::test_i_device_only_mydev"
    assert f.cpu_only == 1
    # one cause, two tests: one group; the setUpClass error is a group of its own; a crash is in no group
    assert f.messages[0] == {
        "message": "AssertionError: Tensor-likes are not close! at <addr>, <device>, index N",
        "count": 2,
        "example": "TestFooMYDEV::test_b_mismatch_mydev_float32",
    }
    assert len(f.messages) == 2 and "<device> could not be initialised" in f.messages[1]["message"]
    assert not any("NotGeneric" in nid for side in (f.cpu, f.dev) for nid in side.outcomes)
    assert not f.errors
    assert report.exit_code == 1
    # the JSON report (also written to out/report.json) and the text say the same
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written == json.loads(json.dumps(report.to_json()))
    assert written["totals"]["on_device"]["crashed"] == 1 and written["files"][0]["skew"][0]["cpu"] == "failed"
    text = "\n".join(report.lines())
    assert "test_generic.py: 7 pass on the CPU; on mydev: 2 passed, 2 failed, 1 errored, 1 skipped, 1 crashed" in text
    assert "crashed on mydev: TestFooMYDEV::test_c_crash_mydev: the process was killed by SIGABRT" in text
    assert text.endswith("FAILED")


def test_file_expr_selects_and_a_clean_file_exits_0(tests_dir, tmp_path):
    report = _run(tests_dir, tmp_path / "out", "test_generic=test_add or skew")  # .py may be left out
    f = report.files[0]
    assert f.spec.expr == "test_add or skew"
    assert f.cpu_passed == 1 and f.on_device["passed"] == 1 and len(f.skew) == 1
    assert report.exit_code == 0  # skew alone is not the backend's failure


def test_a_hanging_test_is_killed_and_the_rest_runs(tests_dir, tmp_path):
    report = _run(tests_dir, tmp_path / "out", "test_hang.py", timeout=3)
    f = report.files[0]
    assert f.on_device["passed"] == 1 and f.on_device["crashed"] == 1
    assert f.crashes[0]["test"] == "TestHangMYDEV::test_a_mydev"
    assert f.crashes[0]["message"].startswith("timed out: the process ran longer than 3 s")
    assert report.exit_code == 1


def test_a_file_without_device_tests_fails_and_says_why(tests_dir, tmp_path):
    report = _run(tests_dir, tmp_path / "out", "test_cpu_only.py")
    assert report.files[0].device_broken and report.exit_code == 1
    assert "no mydev tests were collected: is torch.mydev.is_available() true?" in "\n".join(report.lines())


def test_a_device_side_that_dies_while_collecting_fails_the_file(tests_dir, tmp_path):
    (tests_dir / "test_import_crash.py").write_text(
        "import os, unittest\n"
        "if os.environ['PYTORCH_TESTING_DEVICE_ONLY_FOR'] == 'mydev':\n"
        "    os.abort()  # as a backend that crashes when the file imports it\n"
        "class TestICPU(unittest.TestCase):\n"
        "    def test_a_cpu(self): pass\n"
    )
    report = _run(tests_dir, tmp_path / "out", "test_import_crash.py")
    f = report.files[0]
    assert f.device_broken and report.exit_code == 1
    assert f.errors[0].startswith("mydev: the process was killed by SIGABRT while collecting"), f.errors


def test_restarts_are_bounded(tests_dir, tmp_path):
    crashing = tests_dir / "test_crashes.py"
    crashing.write_text(
        "import os, unittest\n"
        "class TestKCPU(unittest.TestCase):\n"
        + "".join(f"    def test_{i}_cpu(self): pass\n" for i in "abc")
        + "class TestKMYDEV(unittest.TestCase):\n"
        + "".join(f"    def test_{i}_mydev(self): os.abort()\n" for i in "abc")
    )
    cpu, dev = pt.cpu_side(), pt.device_side("mydev")
    spec = pt.parse_files(tests_dir, ["test_crashes.py"])[0]
    f = pt.compare(
        spec, pt.run_side(spec, cpu, tmp_path, timeout=60), pt.run_side(spec, dev, tmp_path, timeout=60, max_crashes=2)
    )
    assert f.on_device["crashed"] == 2 and f.on_device["not_run"] == 1
    assert any("stopped after 2 crashed processes: 1 tests not run" in e for e in f.errors)


@pytest.mark.parametrize(
    ("device_test", "cpu_test"),
    [
        ("t.py::TestFooMYDEV::test_add_mydev_float32", "t.py::TestFooCPU::test_add_cpu_float32"),
        ("t.py::TestFooPRIVATEUSE1::test_add_mydev", "t.py::TestFooCPU::test_add_cpu"),
        # the device is the last one: a test may carry `cpu` in its own name
        ("t.py::TestFooMYDEV::test_cpu_to_mydev_mydev_int64", "t.py::TestFooCPU::test_cpu_to_mydev_cpu_int64"),
    ],
)
def test_twins_pair(device_test, cpu_test):
    assert pt.twin_key(device_test, pt.device_side("mydev")) == pt.twin_key(cpu_test, pt.cpu_side()) is not None


def test_messages_are_normalised():
    n = pt.normalise("RuntimeError: expected mydev:1 and cpu, got 0x7ffe12 of size [2, 3] (1e-05)\nmore", "mydev")
    assert n == "RuntimeError: expected <device> and cpu, got <addr> of size [N, N] (N)"
    assert pt.normalise("float32 conv2d MYDEV", "mydev") == "float32 conv2d <device>"


def test_bad_input_is_one_line_exit_2(tests_dir, tmp_path, rendered_project):
    cases = [
        (["test_generic.py"], "FILE goes with --pytorch-tests DIR"),
        (["--pytorch-tests", str(tests_dir), "--opinfo", "x.py"], "runs PyTorch's test files alone: drop --opinfo"),
        (["--pytorch-tests", str(tests_dir), "x.py"], "not inside a backendgen project"),
        (["--pytorch-tests", str(tmp_path / "nope"), "x.py", "--project", str(rendered_project)], "no PyTorch tests"),
        (["--pytorch-tests", str(tests_dir), "--project", str(rendered_project)], "name the test files"),
        (["--pytorch-tests", str(tests_dir), "test_nope.py", "--project", str(rendered_project)], "no test file"),
        (["--pytorch-tests", str(tests_dir), "test_generic.py", "--project", str(rendered_project)], "not installed"),
    ]
    for args, message in cases:
        out = run_cli("test", *args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)


TINY = """\
import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


class TestTiny(TestCase):
    @dtypes(torch.float32, torch.int64)
    def test_add(self, device, dtype):
        x = torch.ones(3, device=device, dtype=dtype)
        self.assertEqual((x + x).sum().item(), 6)

    def test_skew(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 3)


instantiate_device_type_tests(TestTiny, globals())
"""


@pytest.mark.slow
def test_a_real_device_generic_file_on_the_sessions_backend(installed, tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY)
    out = run_cli("test", "--pytorch-tests", str(tmp_path), "test_tiny.py", "--project", str(installed), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    f = json.loads(out.stdout)["files"][0]
    assert f["cpu_passed"] == 2 and f["on_device"]["passed"] == 2, f
    device = json.loads((installed / "backendgen.json").read_text())["device"]
    assert [s["test"] for s in f["skew"]] in (
        [f"TestTinyPRIVATEUSE1::test_skew_{device}"],
        [f"TestTiny{device.upper()}::test_skew_{device}"],
    ), textwrap.shorten(str(f), 500)
