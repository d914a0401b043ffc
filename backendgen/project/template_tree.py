"""What a template tree is, file by file, and its state hash.

A template directory is read here and nowhere else file by file: the installed template (an
editable checkout's `template/`, or `backendgen/_template` in a wheel install, where pip has
byte-compiled the template's `.py` files into `__pycache__/`), an earlier state extracted from
backendgen.project.history, or a project rendered from either. Files that are not part of a template
(`__pycache__/`, `*.pyc`, `*.pyo`) are never read, hashed or rendered into a project; every file
is read as bytes (`text_or_bytes` gives the text of a UTF-8 file, the bytes of anything else).

The state hash names one exact state of the template (backendgen.json `template_state`): the hex
SHA-256 of the lines `<sha256 of the file's bytes>  <path>\\n`, sorted by path (`sha256sum`'s
format). It depends on the files' paths and bytes only, not on their order on disk, their times,
their modes or how backendgen was installed.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

IGNORED_DIRS = frozenset({"__pycache__"})
IGNORED_SUFFIXES = (".pyc", ".pyo")


def is_ignored(rel: str) -> bool:
    """Whether the path `rel` (relative, with `/`) is not part of a template: bytecode pip or Python wrote."""
    parts = rel.split("/")
    return any(p in IGNORED_DIRS for p in parts) or parts[-1].endswith(IGNORED_SUFFIXES)


def paths(root: Path) -> list[str]:
    """The template's files under `root` (relative, `/`-separated, sorted); symlinks are followed as
    cookiecutter does."""
    root = Path(root)
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not is_ignored(rel):
            out.append(rel)
    return sorted(out)


def files(root: Path) -> dict[str, bytes]:
    """Every file of the template (or rendered project) under `root`, as bytes."""
    root = Path(root)
    return {rel: (root / rel).read_bytes() for rel in paths(root)}


def text_or_bytes(data: bytes) -> str | bytes:
    """A file's text if it is UTF-8, else its bytes (a binary file is compared and copied, never merged)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def blob_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_hash_of(blobs: dict[str, str]) -> str:
    """The state hash from {path: sha256 of the file's bytes}."""
    lines = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(blobs.items()) if not is_ignored(rel))
    return hashlib.sha256(lines.encode()).hexdigest()


def state_hash(root: Path) -> str:
    """The state hash of the template directory `root`."""
    return state_hash_of({rel: blob_hash(data) for rel, data in files(root).items()})


def prune(root: Path) -> None:
    """Remove what is not part of a template from a rendered tree (cookiecutter copies every file it finds)."""
    root = Path(root)
    for path in sorted(root.rglob("*"), reverse=True):
        rel = path.relative_to(root).as_posix()
        if not is_ignored(rel) or not path.exists():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
