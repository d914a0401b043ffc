"""A generated project on disk: its metadata file, a lock, and transactional edits.

`backendgen.json` at the project root records what the project was generated from and every
operator it registers with its schema and C++ signature; `Project.record` is it, typed
(backendgen.project.record). Edits go through `Transaction`, which restores every touched file if
anything fails; commands use it through backendgen.commands.transaction.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

from backendgen import __version__
from backendgen.plumbing.errors import LockedError, NotAProjectError, ProjectError
from backendgen.plumbing.files import write_atomic
from backendgen.project import history, manifest
from backendgen.project import record as metadata
from backendgen.project.record import OpRecord, OverrideRecord, OwnOpRecord, Record

METADATA_FILE = "backendgen.json"
LOCK_FILE = ".backendgen.lock"


@dataclass
class Project:
    root: Path
    record: Record  # backendgen.json, typed (backendgen.project.record)

    @property
    def device(self) -> str:
        return self.record.device

    @property
    def package(self) -> str:
        return self.record.package

    @property
    def dist_name(self) -> str:
        return self.record.dist_name

    @property
    def driver(self) -> str:
        """The device driver it was made with (`backendgen new --driver`): projects that do not
        record one were all made with the emulator."""
        return self.record.driver or manifest.EMULATOR

    @property
    def template_version(self) -> int:
        """The template the project was generated from (template/template.json); 1 if unrecorded."""
        try:
            return int(self.record.template_version or 1)
        except (TypeError, ValueError):
            return 1

    def require_known_template(self) -> None:
        """Refuse a project from a template newer than this backendgen's: what this backendgen would
        write follows an older layout, and its records may not know the newer fields."""
        current = manifest.load().template_version
        if self.template_version > current:
            made = self.record.backendgen_version or "a newer one"
            raise ProjectError(
                f"this project is from template {self.template_version} (backendgen {made}), newer than this "
                f"backendgen's template {current} (backendgen {__version__}): upgrade backendgen "
                "(pip install -U backendgen) to change it"
            )

    @property
    def paths(self) -> dict[str, str]:
        """Where things live in this project: the "paths" of its own template version's manifest
        (backendgen.project.history.paths_of), e.g. "registration" (every add-op kernel's m.impl,
        generated), "compile_tests", "distributed_tests", "model_tests" (the opt-in suites)."""
        return history.paths_of(self.template_version)

    @property
    def registration_file(self) -> str:
        """The generated registration file, relative to the root (backendgen.kinds.registration)."""
        return self.paths["registration"]

    @property
    def features(self) -> frozenset[str]:
        """The manifest's named features its template has (backendgen.project.manifest)."""
        return manifest.load().features_of(self.template_version)

    @property
    def torch_version(self) -> str:
        return self.record.torch.version

    @property
    def yaml_sha256(self) -> str | None:
        return self.record.torch.native_functions_sha256

    @property
    def ops(self) -> list[OpRecord]:
        return list(self.record.ops)

    def find_op(self, qualified: str) -> OpRecord | None:
        for rec in self.record.ops:
            if rec.op == qualified:
                return rec
        return None

    def covering(self, qualified: str) -> OpRecord | None:
        """The record whose kernel makes `qualified` native (the op itself or a structured variant)."""
        for rec in self.record.ops:
            if rec.op == qualified or qualified in rec.covers:
                return rec
        return None

    @property
    def registrations(self) -> list[dict]:
        """The kernels registered by the generated registration file."""
        return [rec.registration for rec in self.record.ops if rec.registration]

    @property
    def custom_ops(self) -> list[OwnOpRecord]:
        """The backend's own operators (add-op <device>::NAME --schema ...), as recorded."""
        return list(self.record.custom_ops or [])

    @property
    def autograd_overrides(self) -> list[OverrideRecord]:
        """ATen operators whose derivative the backend replaces on the device (add-op aten::OP --autograd)."""
        return list(self.record.autograd_overrides or [])

    @property
    def amp_table(self) -> dict[str, str] | None:
        """The autocast table (operator -> policy); None for a project from before template 7."""
        table = self.record.amp
        return dict(table) if isinstance(table, dict) else None

    def put(self, section: str, rec: OwnOpRecord | OverrideRecord) -> None:
        """Record `rec` in `section` ("custom_ops", "autograd_overrides"), replacing one of the same op."""
        items = [r for r in getattr(self.record, section) or [] if r.op != rec.op]
        setattr(self.record, section, sorted([*items, rec], key=lambda r: r.op))

    def drop(self, section: str, op: str) -> None:
        setattr(self.record, section, [r for r in getattr(self.record, section) or [] if r.op != op])

    def add_op(self, rec: OpRecord) -> None:
        """Record `rec`, in place of an earlier record of the same operator."""
        ops = self.record.ops
        at = next((i for i, r in enumerate(ops) if r.op == rec.op), None)
        if at is None:
            ops.append(rec)
        else:
            ops[at] = rec

    def remove_op(self, qualified: str) -> None:
        self.record.ops = [r for r in self.record.ops if r.op != qualified]

    @property
    def metadata_path(self) -> Path:
        return self.root / METADATA_FILE

    def metadata_text(self) -> str:
        """backendgen.json's text for the record."""
        return json.dumps(self.record.to_json(), indent=2, sort_keys=False) + "\n"

    def save(self) -> None:
        write_atomic(self.metadata_path, self.metadata_text())

    @classmethod
    def load(cls, root: Path) -> Project:
        root = Path(root)
        path = root / METADATA_FILE
        if not root.is_dir():
            raise ProjectError(f"{root} is not a directory")
        if not path.is_file():
            raise NotAProjectError(
                f"{root} is not a backendgen project (no {METADATA_FILE}); "
                "run inside a generated project or pass --project DIR"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ProjectError(
                f"{path} is not valid JSON (not UTF-8: {e.reason}): it is corrupted; {metadata.RESTORE}"
            ) from None
        except ValueError as e:
            raise ProjectError(f"{path} is not valid JSON ({e}): it is corrupted; {metadata.RESTORE}") from None
        except OSError as e:
            raise ProjectError(f"cannot read {path}: {e.strerror}") from None
        return cls(
            root.resolve(), Record.load(data, str(path))
        )  # validated whole, once: nothing reads an unchecked value

    @classmethod
    def of(cls, project_dir: Path | None) -> Project:
        """The project a command was pointed at (`--project DIR`), or the one containing the current directory."""
        return cls.find() if project_dir is None else cls.load(Path(project_dir))

    @classmethod
    def find(cls, start: Path | None = None) -> Project:
        """The project containing `start` (default: the current directory)."""
        start = Path(start or Path.cwd()).resolve()
        for d in (start, *start.parents):
            if (d / METADATA_FILE).is_file():
                return cls.load(d)
        raise NotAProjectError(
            f"not inside a backendgen project ({METADATA_FILE} not found in {start} or above); pass --project DIR"
        )

    @contextlib.contextmanager
    def lock(self):
        """Hold an exclusive lock on the project for one command."""
        path = self.root / LOCK_FILE
        try:
            fh = open(path, "a+")
        except OSError as e:
            raise ProjectError(f"cannot write to {self.root}: {e.strerror}") from None
        try:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise LockedError(
                        f"another backendgen command is working on {self.root}; wait for it to finish"
                    ) from None
                raise
            yield self
        finally:
            fh.close()


class Transaction:
    """Remembers files before they are written and puts them back if the block fails.

    Files that did not exist are removed again. Used as a context manager: leaving the block with
    an exception rolls back, leaving it normally keeps the changes; `rollback()` also undoes them.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._saved: dict[Path, bytes | None] = {}
        self._dirs: list[Path] = []

    def _remember(self, path: Path) -> None:
        path = Path(path)
        if path in self._saved:
            return
        self._saved[path] = path.read_bytes() if path.exists() else None
        d = path.parent
        missing = []
        while not d.exists():
            missing.append(d)
            d = d.parent
        self._dirs.extend(reversed(missing))

    def write(self, path: Path, text: str) -> None:
        self._remember(path)
        write_atomic(path, text)

    def remove(self, path: Path) -> None:
        """Delete `path` (a rollback puts it back)."""
        self._remember(path)
        Path(path).unlink(missing_ok=True)

    def touch_file(self, path: Path) -> None:
        """Remember `path` so that a rollback restores it after someone else rewrites it."""
        self._remember(path)

    @property
    def written(self) -> list[Path]:
        return list(self._saved)

    def rollback(self) -> None:
        for path, content in reversed(list(self._saved.items())):
            if content is None:
                if path.exists() or path.is_symlink():  # (a read-only file system refuses even a missing one)
                    path.unlink()
            else:
                path.write_bytes(content)
        for d in reversed(self._dirs):
            with contextlib.suppress(OSError):
                d.rmdir()
        self._saved.clear()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.rollback()
        return False
