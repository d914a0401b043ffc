"""`backendgen test`: a project's tests, its conformance suite and its opt-in suites."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backendgen.commands.transaction import check_no_other_backend
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import Project
from backendgen.toolchain import build


@dataclass(frozen=True)
class OptInSuite:
    """A part of a generated project's tests that its pytest settings leave out by default (slow:
    each `backendgen test --<option>` runs one after the project's quick suite)."""

    option: str  # the `backendgen test` option, without dashes
    marker: str  # the pytest marker that selects it
    paths_key: str  # where it lives in the project: this key of Project.paths
    what: str  # for messages: "torch.compile tests"
    since: int  # the template version that added it


OPT_IN_SUITES = (
    OptInSuite("compile", "compile", "compile_tests", "torch.compile tests", 6),
    OptInSuite("distributed", "distributed", "distributed_tests", "multi-process tests", 6),
    OptInSuite("models", "models", "model_tests", "model suite", 9),
)


@dataclass
class SuiteRun:
    suite: OptInSuite
    log: Path | None = None
    failure: str | None = None  # why it failed (None: it passed)


@dataclass
class TestResult:
    __test__ = False  # not a pytest test class

    root: Path
    tests_log: Path | None = None
    tests_failure: str | None = None  # why the project's tests failed (None: they passed)
    suite: object | None = None  # conformance.SuiteResult, with opinfo
    opt_in: list[SuiteRun] = field(default_factory=list)  # the opt-in suites asked for, in order

    @property
    def exit_code(self) -> int:
        failed = self.tests_failure or any(run.failure for run in self.opt_in)
        return 1 if failed or (self.suite is not None and not self.suite.ok) else 0


def test_backend(
    project_dir: Path | None = None,
    *,
    opinfo: bool = False,
    opt_in: tuple[str, ...] = (),
    patterns: list[str] | None = None,
    dtypes: list[str] | None = None,
    samples: int | None = None,
    workers: int | None = None,
    strict: bool = False,
    write_expected: Path | None = None,
    reporter: Reporter | None = None,
) -> TestResult:
    """Run the project's tests; with `opinfo` also its conformance suite (backendgen.toolchain.conformance);
    then each opt-in suite named in `opt_in` (OPT_IN_SUITES: "compile", "distributed", "models"). Failures
    are in the result (exit_code 1); bad arguments raise UserError."""
    from backendgen.plumbing.errors import TestFailure
    from backendgen.toolchain import conformance

    rep = reporter or Reporter()
    project = Project.of(project_dir)
    if build.extension_path(project.root, project.package) is None:
        raise ProjectError(f"{project.root} is not built yet; run backendgen build --project {project.root}")
    check_no_other_backend(project.dist_name)
    if not opinfo and (patterns or dtypes or samples is not None or workers is not None or strict or write_expected):
        raise UserError(
            "-k, --dtype, --samples, --workers, --strict and --write-expected select the conformance suite: "
            "add --opinfo"
        )
    by_option = {s.option: s for s in OPT_IN_SUITES}
    unknown = [name for name in opt_in if name not in by_option]
    if unknown:
        raise UserError(f"no opt-in test suite {unknown[0]!r}; there are: {', '.join(by_option)}")
    suites = [by_option[name] for name in dict.fromkeys(opt_in)]
    for s in suites:
        if not (project.root / project.paths[s.paths_key]).exists():
            raise ProjectError(
                f"{project.root} has no {s.what} ({project.paths[s.paths_key]}, template {s.since} and later); "
                "docs/upgrading.md says how an older project takes them over"
            )
    result = TestResult(project.root)
    with project.lock():
        if opinfo:  # first: it checks its arguments before anything runs
            with rep.step("conformance"):
                result.suite = conformance.run_suite(
                    project.root,
                    runner=project.paths["conformance_runner"],
                    patterns=patterns,
                    dtypes=dtypes,
                    samples=samples,
                    workers=workers,
                    strict=strict,
                    write_expected=write_expected,
                )
        with rep.step("test", build.watch_tests(project.root)):
            try:
                result.tests_log = build.run_tests(project.root)
            except TestFailure as e:
                result.tests_failure, result.tests_log = str(e), e.log
        for s in suites:
            run = SuiteRun(s)
            with rep.step(s.option, build.watch_tests(project.root, s.option)):
                try:
                    run.log = build.run_tests(
                        project.root, [project.paths[s.paths_key]], name=s.option, marker=s.marker
                    )
                except TestFailure as e:
                    run.failure, run.log = str(e), e.log
            result.opt_in.append(run)
    return result
