"""The conformance suite every generated project carries (tests/conformance, docs/conformance.md)
and `backendgen test --opinfo`: the whole OpInfo database on the session's backend, a kernel
broken on purpose and one that aborts, and the expected-failure logic on its own."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
import tomllib
from conftest import run_cli

from backendgen import api
from backendgen.toolchain import conformance

VARIANTS = ("forward", "backward", "inplace", "out")


def _report(root):
    return json.loads((root / "build" / "backendgen-conformance.json").read_text())


def _count_line(stdout: str, variant: str, dtype: str) -> dict[str, int] | None:
    m = re.search(
        rf"^{variant}\s+{dtype}: (\d+) pass, (\d+) fail \((\d+) mismatch, (\d+) error\), (\d+) crash, "
        rf"(\d+) hang, (\d+) xfail, (\d+) fixed, (\d+) skip$",
        stdout,
        re.MULTILINE,
    )
    if m is None:
        return None
    keys = ("pass", "fail", "mismatch", "error", "crash", "hang", "xfail", "fixed", "skip")
    return dict(zip(keys, map(int, m.groups()), strict=True))


def test_the_generated_backend_passes_the_conformance_suite(opt_in_run):
    # float32 and one integer dtype, every OpInfo, in one run (one worker start-up): the session's
    # `backendgen test` with every suite (conftest.py's opt_in_run; CONFORMANCE_ARGS)
    out, _, report = opt_in_run
    summary = [ln for ln in out.stdout.splitlines() if not ln.startswith(("FAIL ", "FIXED "))]
    fails = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAIL ", "FIXED "))]
    # exit 0 unless a suite failed: the conformance suite (below) or one of the others (their own tests)
    others = ("torch.compile tests: passed", "multi-process tests: passed", "model suite: passed")
    assert out.returncode == (0 if all(o in out.stdout for o in others) else 1), "\n".join(
        summary + fails[:60] + [out.stderr[-2000:]]
    )
    assert "project tests: passed" in out.stdout
    for dtype in ("float32", "int64"):
        for variant in VARIANTS:
            counts = _count_line(out.stdout, variant, dtype)
            assert counts is not None, f"no summary line for {variant} {dtype}:\n{out.stdout[-3000:]}"
            assert counts["fail"] == counts["crash"] == counts["hang"] == 0, (variant, dtype, counts)
        assert _count_line(out.stdout, "forward", dtype)["pass"] > (400 if dtype == "float32" else 150), out.stdout
    assert not re.search(r"^(FAIL|UNEXPLAINED) ", out.stdout, re.MULTILINE), out.stdout
    # forward and backward compute what the CPU computes: no mismatch and no crash there, listed or not
    assert report is not None, out.stdout[-3000:]
    wrong = [
        (r["op"], r["variant"], r["dtype"], r["status"])
        for r in report["results"]
        if r["variant"] in ("forward", "backward") and r["status"] in ("mismatch", "crash")
    ]
    assert wrong == [], wrong
    # every listed failure says why
    assert all(r["reason"] and r["reason"] != "UNEXPLAINED" for r in report["results"] if r["verdict"] == "xfail")


def test_a_broken_kernel_is_caught_and_an_aborting_one_is_isolated(project_copy):
    root = project_copy
    res = api.add_ops(["abs.out", "exp2.out"], root, test_it=False)
    assert res.built
    marker = "  // ---- end of device computation"
    abs_cpp, exp2_cpp = root / "csrc/aten/ops/abs.cpp", root / "csrc/aten/ops/exp2.cpp"
    assert marker in abs_cpp.read_text() and marker in exp2_cpp.read_text()
    # in every path of the kernel: the queued one and the calling thread's (an out= call that resizes)
    abs_cpp.write_text(abs_cpp.read_text().replace(marker, "  out.add_(1);  // wrong on purpose\n" + marker))
    exp2_cpp.write_text(exp2_cpp.read_text().replace(marker, "  std::abort();  // crashes on purpose\n" + marker))
    built = run_cli("build", "--project", str(root))
    assert built.returncode == 0, built.stdout + built.stderr

    # one worker: after the abort, a fresh worker must carry on with whatever is left. The suite alone,
    # as `backendgen test --opinfo -k abs -k exp2 --workers 1` runs it before the quick suite (which
    # has nothing to say about these kernels: opt_in_run runs the CLI's whole path); printed as the CLI
    # prints it
    suite = conformance.run_suite(root, patterns=["abs", "exp2"], workers=1)
    printed = "\n".join([suite.head, *suite.summary, *suite.failures, suite.tail])
    assert suite.exit_code == 1, printed
    assert re.search(r"^FAIL abs \[forward float32\] mismatch: .*values differ", printed, re.MULTILINE), printed
    report = _report(root)
    results = report["results"]
    crashes = [r for r in results if r["op"] == "exp2" and r["status"] == "crash"]
    assert crashes and all(r["verdict"] == "fail" and "SIGABRT" in r["detail"] for r in crashes), results
    assert re.search(
        r"^FAIL exp2 \[\w+ float32\] crash: the worker died \(killed by SIGABRT\)", printed, re.MULTILINE
    ), printed
    # nothing was lost to the crash: every (op, variant) has a result, and results kept coming after it
    ops = {r["op"] for r in results}
    assert {"abs", "exp2"} <= ops
    assert sorted((r["op"], r["variant"]) for r in results) == sorted((op, v) for op in ops for v in VARIANTS)
    first_crash = next(i for i, r in enumerate(results) if r["status"] == "crash")
    assert any(r["status"] != "crash" for r in results[first_crash + 1 :]) or len(crashes) > 1, results
    count = _count_line(printed, "forward", "float32")
    assert count is not None and count["mismatch"] >= 1, printed


def test_bad_arguments_exit_2_before_anything_runs(built_project):
    out = run_cli("test", "--opinfo", "--dtype", "float33", "--project", str(built_project))
    assert out.returncode == 2 and "unknown dtype 'float33'" in out.stderr, out.stdout + out.stderr
    assert "project tests" not in out.stdout
    out = run_cli("test", "--opinfo", "-k", "no_such_opinfo_anywhere", "--project", str(built_project))
    assert out.returncode == 2 and "no OpInfo matches no_such_opinfo_anywhere" in out.stderr, out.stdout + out.stderr
    out = run_cli("test", "-k", "abs", "--project", str(built_project))
    assert out.returncode == 2 and "add --opinfo" in out.stderr
    out = run_cli("test", "--opinfo", "--samples", "0", "--project", str(built_project))
    assert out.returncode == 2 and "--samples must be at least 1" in out.stderr


def test_the_conformance_tests_are_opt_in(rendered_project):
    addopts = tomllib.loads((rendered_project / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "addopts"
    ]
    assert "not conformance" in addopts, addopts
    assert "@pytest.mark.conformance" in (rendered_project / "tests/conformance/test_conformance.py").read_text()
    assert "pytest -m conformance" in (rendered_project / "README.md").read_text()


# --- the expected-failure logic -------------------------------------------------------------------


@pytest.fixture
def expectations(rendered_project):
    """The generated project's expectations module (plain Python: no torch, no build needed)."""
    path = rendered_project / "tests" / "conformance" / "expectations.py"
    spec = importlib.util.spec_from_file_location("generated_expectations", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _write(tmp_path, entries):
    path = tmp_path / "expected.json"
    path.write_text(json.dumps({"format": 1, "entries": entries}))
    return path


def _result(op, variant, status, dtype="float32"):
    return {"op": op, "dtype": dtype, "variant": variant, "status": status, "detail": f"{op} {status}"}


def test_listed_failures_are_expected_and_unlisted_ones_fail(expectations, tmp_path):
    entries = expectations.load(
        _write(
            tmp_path,
            [
                {"op": "index_add", "variants": ["inplace"], "reason": "the CPU reference is itself wrong here"},
                {"op": "linalg.*", "variants": ["out"], "dtypes": ["float64"], "reason": "a layout we do not support"},
            ],
        )
    )
    j = expectations.judge(
        [
            _result("index_add", "inplace", "mismatch"),
            _result("index_add", "out", "mismatch"),  # listed for inplace only
            _result("linalg.qr", "out", "crash", "float64"),
            _result("linalg.qr", "out", "mismatch", "float32"),  # listed for float64 only
            _result("abs", "forward", "pass"),
            _result("abs", "backward", "skipped"),
        ],
        entries,
        "2.13.0",
    )
    verdicts = {(v.op, v.variant, v.dtype): v.verdict for v in j.verdicts}
    assert verdicts == {
        ("index_add", "inplace", "float32"): "xfail",
        ("index_add", "out", "float32"): "fail",
        ("linalg.qr", "out", "float64"): "xfail",
        ("linalg.qr", "out", "float32"): "fail",
        ("abs", "forward", "float32"): "pass",
        ("abs", "backward", "float32"): "skip",
    }
    assert j.exit_code() == 1
    counts = j.counts()
    assert counts[("out", "float32")]["fail"] == counts[("out", "float32")]["mismatch"] == 2
    assert counts[("out", "float64")]["xfail"] == 1 and counts[("out", "float64")]["crash"] == 0


def test_a_listed_failure_that_passes_is_reported_fixed_and_fails_only_when_strict(expectations, tmp_path):
    entries = expectations.load(_write(tmp_path, [{"op": "abs", "variants": ["out"], "reason": "known"}]))
    j = expectations.judge([_result("abs", "out", "pass")], entries, "2.13.0")
    assert [v.verdict for v in j.verdicts] == ["fixed"]
    assert j.exit_code() == 0 and j.exit_code(strict=True) == 1


def test_an_unexplained_entry_fails_the_suite(expectations, tmp_path):
    entries = expectations.load(_write(tmp_path, [{"op": "abs", "variants": ["out"], "reason": "UNEXPLAINED"}]))
    j = expectations.judge([_result("abs", "out", "mismatch")], entries, "2.13.0")
    assert [v.verdict for v in j.verdicts] == ["xfail"]
    assert [e.op for e in j.unexplained] == ["abs"] and j.exit_code() == 1
    # an empty reason is no explanation either, even for an op this run did not touch
    entries = expectations.load(_write(tmp_path, [{"op": "neg", "variants": ["*"], "reason": " "}]))
    assert expectations.judge([], entries, "2.13.0").exit_code() == 1


def test_a_torch_qualifier_limits_an_entry_to_those_versions(expectations, tmp_path):
    entries = expectations.load(_write(tmp_path, [{"op": "abs", "variants": ["out"], "torch": "2.13", "reason": "r"}]))
    assert expectations.judge([_result("abs", "out", "mismatch")], entries, "2.13.0+cpu").verdicts[0].verdict == "xfail"
    assert expectations.judge([_result("abs", "out", "mismatch")], entries, "2.14.1").verdicts[0].verdict == "fail"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"op": "abs", "variants": ["out"]}, "needs a 'reason'"),
        ({"op": "abs", "variants": ["sideways"], "reason": "r"}, "'variants' must list"),
        ({"op": "abs", "variants": ["out"], "reason": "r", "dtype": "float32"}, "unknown key 'dtype'"),
    ],
)
def test_a_malformed_list_is_refused(expectations, tmp_path, entry, message):
    with pytest.raises(expectations.ListError, match=message):
        expectations.load(_write(tmp_path, [entry]))


def test_write_expected_keeps_explained_entries_and_adds_unexplained_ones(expectations, tmp_path):
    entries = expectations.load(
        _write(
            tmp_path,
            [
                {"op": "index_add", "variants": ["inplace", "out"], "reason": "explained"},
                {"op": "cumsum", "variants": ["out"], "reason": "not run this time"},
                {"op": "abs", "variants": ["out"], "reason": "fixed since"},
            ],
        )
    )
    results = [
        _result("index_add", "inplace", "mismatch"),
        _result("index_add", "out", "pass"),
        _result("abs", "out", "pass"),
        _result("neg", "inplace", "mismatch", "float32"),
        _result("neg", "out", "error", "float32"),
        _result("neg", "inplace", "pass", "int64"),
        _result("neg", "out", "error", "int64"),
    ]
    j = expectations.judge(results, entries, "2.13.0")
    new = json.loads(expectations.dump(expectations.rewrite(entries, j, "2.13.0")))["entries"]
    assert new == [
        {"op": "index_add", "variants": ["inplace"], "reason": "explained"},
        {"op": "cumsum", "variants": ["out"], "reason": "not run this time"},
        {"op": "neg", "variants": ["out"], "reason": "UNEXPLAINED"},
        {"op": "neg", "variants": ["inplace"], "dtypes": ["float32"], "reason": "UNEXPLAINED"},
    ]
    # and the list written is one the suite refuses until someone explains those failures
    path = tmp_path / "written.json"
    path.write_text(expectations.dump(expectations.rewrite(entries, j, "2.13.0")))
    again = expectations.judge(results, expectations.load(path), "2.13.0")
    assert again.of("fail") == [] and len(again.unexplained) == 2 and again.exit_code() == 1
