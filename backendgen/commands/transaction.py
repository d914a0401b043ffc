"""The one way a command changes a project: lock, consistency check, gate and plan (the command's own),
write, build, test, then keep the change or roll every file back.

    with transaction.change(project) as change:      # lock; backendgen.json vs files vs built library
        ...gate and plan: raise before anything is written...
        with change.writing(rep) as tx:              # every file through the project's Transaction
            tx.write(path, text)
        change.build_and_test(rep, tests=[...])      # a failure here puts every file back

Leaving the block with an exception rolls back every file written through `change.tx` (and the built
library, which a failed build may have replaced, with the record of what it was built from). SIGTERM
and SIGHUP arrive as KeyboardInterrupt (plumbing.interrupt), so they roll back too. With
`keep_on_failure` a failure (not an interrupt) keeps the files and says so in the error's hint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from backendgen.commands import consistency
from backendgen.plumbing.errors import EnvironmentProblem
from backendgen.plumbing.files import writes
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import Project, Transaction
from backendgen.toolchain import build


@dataclass
class Change:
    project: Project
    state: consistency.State
    rebuilds: bool = True  # the command rebuilds: a rollback restores the built library too
    keep_on_failure: bool = False
    kept: str = "the new files were kept (--keep-on-failure): {files}"  # the hint when they are
    tx: Transaction | None = None
    built: bool = False
    tested: bool = False
    log: Path | None = None  # the tests' log

    def require_files(self, *, ignore: tuple[str, ...] = ()) -> None:
        """Refuse when a file the record names is gone (except those in `ignore`)."""
        consistency.require_files(self.project, self.state, ignore=ignore)

    @property
    def transaction(self) -> Transaction:
        """The transaction every file is written through (made on first use)."""
        if self.tx is None:
            self.tx = Transaction(self.project.root)
            so = build.extension_path(self.project.root, self.project.package) if self.rebuilds else None
            if so is not None:
                self.tx.touch_file(so)
                self.tx.touch_file(self.project.root / build.BUILT)  # what that library was built from goes with it
        return self.tx

    @contextlib.contextmanager
    def writing(self, rep: Reporter | None = None, *, step: str = "write") -> Iterator[Transaction]:
        """The write step: a full disk or a read-only project is one line, and nothing stays half-written."""
        with (
            rep.step(step) if rep is not None else contextlib.nullcontext(),
            writes(self.project.root, "the project was left as it was"),
        ):
            yield self.transaction

    def save_record(self) -> None:
        """Write backendgen.json through the transaction."""
        self.transaction.write(self.project.metadata_path, self.project.metadata_text())

    @property
    def written(self) -> list[Path]:
        """The files written so far (not the built library)."""
        return [p for p in (self.tx.written if self.tx else []) if p.exists() and p.suffix != ".so"]

    def build_and_test(
        self,
        rep: Reporter,
        *,
        tests: list[str] | None = None,
        incremental: bool = True,
        test: bool = True,
        early: bool = False,
        name: str = "test",
    ) -> None:
        """Build; then run `tests` (None: the whole suite; []: none). `early`: the tests' process starts
        while the kernels compile (only into an installed project: a first install is not visible to a
        running process)."""
        p = self.project
        dist = p.dist_name
        early = bool(early and test and tests and build.installed_from(p.root, dist))
        with build.tests_started_early(p.root, tests, name=name) if early else contextlib.nullcontext() as run_early:
            with rep.step("build", build.watch_build(p.root)):
                build.build(p.root, p.package, dist, incremental=incremental)
            self.built = True
            if not test or tests == []:
                return
            with rep.step("test", build.watch_tests(p.root, name)):
                self.log = run_early() if run_early is not None else build.run_tests(p.root, tests, name=name)
            self.tested = True

    def failed(self, exc: BaseException) -> None:
        """Roll back, or keep the files for a look (`keep_on_failure`, not on an interrupt)."""
        if self.tx is None:
            return  # nothing written yet
        if self.keep_on_failure and not isinstance(exc, KeyboardInterrupt):
            if hasattr(exc, "hint"):
                exc.hint = self.kept.format(
                    files=", ".join(str(p.relative_to(self.project.root)) for p in self.written)
                )
        else:
            self.tx.rollback()


@contextlib.contextmanager
def change(
    project: Project,
    *,
    require_files: bool = True,
    rebuilds: bool = True,
    keep_on_failure: bool = False,
    kept: str | None = None,
    edits: bool = True,
) -> Iterator[Change]:
    """Hold the project's lock, inspect it (backendgen.json vs its files vs the built library) and refuse
    a missing file (`require_files`; a command that deletes files checks after it knows which, with
    `Change.require_files`) and, for a command that `edits` the project's files, a project from a
    newer template than this backendgen's; roll back what the block wrote if it fails."""
    if edits:
        project.require_known_template()
    with project.lock():
        ch = Change(project, consistency.inspect(project), rebuilds=rebuilds, keep_on_failure=keep_on_failure)
        if kept is not None:
            ch.kept = kept
        if require_files:
            ch.require_files()
        try:
            yield ch
        except BaseException as exc:
            ch.failed(exc)
            raise


# --- gates ------------------------------------------------------------------------------------------


def check_no_other_backend(dist_name: str) -> None:
    """Only one PrivateUse1 backend can load per process; another autoloading one breaks the new one's tests."""
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="torch.backends"):
        dist = ep.dist.name if ep.dist is not None else ep.value
        if dist.replace("_", "-") != dist_name:
            raise EnvironmentProblem(
                f"another PrivateUse1 backend ({dist}) is installed and loads with every `import torch`; "
                f"only one can load per process: pip uninstall {dist}, or use --no-build"
            )
