"""backendgen.plumbing.files: atomic replacement and hashes."""

from __future__ import annotations

import hashlib

import pytest

from backendgen.plumbing.files import replacing, sha256_of, sha256_text, write_atomic


def test_write_atomic_text_and_bytes_keeps_the_mode(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    write_atomic(path, "one\n")
    path.chmod(0o640)
    write_atomic(path, b"two\n")
    assert path.read_bytes() == b"two\n" and path.stat().st_mode & 0o777 == 0o640
    assert sha256_of(path) == sha256_text("two\n") == hashlib.sha256(b"two\n").hexdigest()
    assert [p.name for p in path.parent.iterdir()] == ["f.txt"]


def test_a_failed_replacement_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]
