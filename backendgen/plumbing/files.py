"""Files backendgen writes and compares: atomic replacement and SHA-256 hashes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def sha256_text(text: str) -> str:
    """The SHA-256 of `text` encoded as UTF-8."""
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes (raises OSError when it cannot be read)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, the temporary file replaces
    `path` in one step (readers see the old or the new file, never half of it, and a process that
    has the old one open or mapped keeps it). On failure the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def writes(where: Path, outcome: str) -> Iterator[None]:
    """Turn a failing write (disk full, read-only file system, permissions) into a one-line error
    (`UserError`) that says where and what became of the files (`outcome`)."""
    try:
        yield
    except OSError as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError)) or e.errno is None:
            raise
        from backendgen.plumbing.errors import UserError

        detail = f" ({e.filename})" if e.filename else ""
        raise UserError(f"cannot write to {where}: {e.strerror}{detail}; {outcome}") from None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file (text or bytes) through `replacing`, keeping the permissions of the file it replaces."""
    with replacing(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        if Path(path).exists():
            shutil.copymode(path, tmp)
