"""`backendgen build`: rebuild a project after its sources changed, or a wheel of it for the installed torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from backendgen.commands import transaction
from backendgen.commands.transaction import check_no_other_backend
from backendgen.plumbing.errors import ProjectError
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import Project
from backendgen.toolchain import build


@dataclass
class BuildResult:
    root: Path
    log: Path
    how: build.How  # How.FAST: only ninja and the link ran
    why_full: str | None = None  # why setup.py (or pip) had to run
    tested: bool = False


def build_backend(
    project_dir: Path | None = None, *, test_it: bool = False, full: bool = False, reporter: Reporter | None = None
) -> BuildResult:
    """Rebuild a project after its sources changed; `full` always goes through setup.py."""
    rep = reporter or Reporter()
    project = Project.of(project_dir)
    if test_it or not build.installed_from(project.root, project.dist_name):
        check_no_other_backend(project.dist_name)  # its tests, or the install, would break
    if test_it:
        build.check_test_tools()
    with transaction.change(project, edits=False):  # a missing file is named, not a compiler error; nothing is written
        with rep.step("build", build.watch_build(project.root)):
            outcome = build.build(project.root, project.package, project.dist_name, allow_fast=not full)
        result = BuildResult(project.root, outcome.log, outcome.how, outcome.why_full)
        if test_it:
            with rep.step("test", build.watch_tests(project.root)):
                build.run_tests(project.root)
            result.tested = True
    return result


def build_wheel(
    project_dir: Path | None = None,
    *,
    out: Path | None = None,
    torch_label: bool = False,
    reporter: Reporter | None = None,
) -> build.WheelOutcome:
    """A wheel of the project for the installed torch, repaired to a manylinux tag (build.build_wheel),
    in `out` (default: the project's dist/). Its metadata requires exactly that torch."""
    rep = reporter or Reporter()
    project = Project.of(project_dir)
    if "pinned_wheel" not in project.features:
        raise ProjectError(
            f"this project's template ({project.template_version}) does not pin torch in its wheel's metadata; "
            "run `backendgen update` first (docs/upgrading.md)"
        )
    build.check_wheel_tools()  # before the step: a missing tool is one line
    with project.lock():
        with rep.step("wheel", build.watch_build(project.root, "wheel")):
            return build.build_wheel(
                project.root, project.device, Path(out) if out else project.root / "dist", torch_label=torch_label
            )
