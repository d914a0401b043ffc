"""torch.compile on a generated backend (the project's compiler/ and tests/test_compile.py):
`backendgen test --compile` runs the project's own compile tests on the session's backend after
its quick suite, and `check` reads the torch sources the integration relies on."""

from __future__ import annotations

import re
import shutil

from conftest import patch_integration_point, run_cli

from backendgen.commands.check import check_project
from backendgen.project import manifest
from backendgen.project.on_disk import Project

COMPILE_TESTS = manifest.load().path("compile_tests")  # where the current template puts it

COMMON = "_inductor/codegen/common.py"


def _counts(log: str) -> dict[str, int]:
    last = log.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", last)}


def test_the_generated_backend_passes_its_compile_tests(built_project, opt_in_run):
    out, logs, _ = opt_in_run
    quick = _counts(logs["test"])
    compiled = logs["compile"]
    assert "project tests: passed" in out.stdout and "torch.compile tests: passed" in out.stdout, (
        out.stdout + out.stderr + compiled[-4000:]
    )
    # the quick suite leaves the compile tests out; the second run is exactly them, every one run
    # (none skipped: the session's backend has two devices)
    assert quick["passed"] >= 30 and quick["deselected"] >= 10, quick
    compile_tests = (built_project / COMPILE_TESTS).read_text().count("\ndef test_") + 1  # one runs twice (mlp, cnn)
    assert compile_tests >= 10
    assert _counts(compiled) == {"passed": compile_tests}, compiled[-2000:]


def test_compile_on_a_project_without_compile_tests_is_refused(project_copy):
    (project_copy / COMPILE_TESTS).unlink()
    out = run_cli("test", "--compile", "--project", str(project_copy))
    assert out.returncode == 2
    assert "has no torch.compile tests" in out.stderr and "docs/upgrading.md" in out.stderr
    assert not (project_copy / "build" / "backendgen-test.log").exists()  # refused before any test ran


def test_check_names_a_missing_compile_extension_point(built_project, monkeypatch):
    report = check_project(Project.load(built_project))
    assert not [f for f in report.findings if f.area == "api" and f.severity != "ok"]
    missing = "def register_backend_for_a_renamed_device"
    patch_integration_point(
        monkeypatch,
        "torch.compile",
        lambda point: {"python_sources": {**point.python_sources, COMMON: (*point.python_sources[COMMON], missing)}},
    )
    report = check_project(Project.load(built_project))
    [finding] = [f for f in report.findings if f.area == "api" and f.severity != "ok"]
    assert finding.severity == "warning" and missing in finding.subject
    assert "torch.compile" in finding.message and "compiler/" in finding.message
    assert report.exit_code == 0 and check_project(Project.load(built_project), strict=True).exit_code == 1


def test_check_skips_the_compile_sources_for_a_project_without_compiler(built_project, tmp_path, monkeypatch):
    patch_integration_point(
        monkeypatch,
        "torch.compile",
        lambda point: {"python_sources": {**point.python_sources, COMMON: ("def not_in_any_torch",)}},
    )
    root = tmp_path / "p"
    shutil.copytree(built_project, root, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    project = Project.load(root)
    shutil.rmtree(root / project.package / "compiler")
    report = check_project(project)
    assert not [f for f in report.findings if f.area == "api" and f.severity != "ok"]
