"""`backendgen test --pytorch-tests DIR FILE[=EXPR]...`: PyTorch's own device-generic test files, run
on the CPU and on the project's device and compared (backendgen.toolchain.pytorch_tests,
docs/conformance.md). The backend only has to be installed, as `import torch` loads it; the logs and
`report.json` go to the project's `build/pytorch-tests/`."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from backendgen.commands.transaction import check_no_other_backend
from backendgen.plumbing.environment import installed_torch
from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import Project
from backendgen.toolchain import build, pytorch_tests

OUT_DIR = "pytorch-tests"  # under the project's build/


def _installed(dist_name: str) -> bool:
    """Whether `dist_name` is installed here as a backend `import torch` loads (its torch.backends entry point)."""
    for ep in importlib.metadata.entry_points(group="torch.backends"):
        dist = ep.dist.name if ep.dist is not None else ep.value
        if dist.replace("_", "-") == dist_name:
            return True
    return False


def run_pytorch_tests(
    tests_dir: Path,
    files: list[str],
    project_dir: Path | None = None,
    *,
    timeout: float = pytorch_tests.DEFAULT_TIMEOUT,
    max_crashes: int = pytorch_tests.MAX_CRASHES,
    reporter: Reporter | None = None,
) -> pytorch_tests.Report:
    """Run each of `files` (`FILE` or `FILE=EXPR`, relative to `tests_dir`, a PyTorch checkout's
    `test/`) on the CPU and on the project's device; bad input raises UserError, the results are in
    the report (exit_code 1 when a test that passes on the CPU does not on the device)."""
    project = Project.of(project_dir)
    if timeout <= 0:
        raise UserError(f"--timeout must be more than 0 seconds, not {timeout:g}")
    specs = pytorch_tests.parse_files(Path(tests_dir), list(files))
    if not _installed(project.dist_name):
        raise ProjectError(
            f"the backend {project.dist_name} is not installed in this Python, so `import torch` does not load it; "
            f"run backendgen build --project {project.root}"
        )
    check_no_other_backend(project.dist_name)
    build.check_test_tools()
    with project.lock():
        return pytorch_tests.run(
            specs,
            project.device,
            project.root / build.LOG_DIR / OUT_DIR,
            tests_dir=Path(tests_dir).resolve(),
            timeout=timeout,
            max_crashes=max_crashes,
            torch_version=installed_torch().version,
            reporter=reporter,
        )
