"""Every git command backendgen runs, in one place: `add-op`'s search of a kernel's committed
versions, `update`'s dirty-tree check and its 3-way merge of a file (git merge-file), and the
maintainer's template history (backendgen.project.history). Each runs through plumbing.interrupt,
in a process group of its own that an interrupt stops, with no terminal input (git never waits
for a prompt). A project outside a git work tree, or a machine without git, is not an error here:
the callers treat "no answer" as "nothing to compare with".
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

from backendgen.plumbing import interrupt


def available() -> bool:
    return shutil.which("git") is not None


def run(*args: str, cwd: Path | None = None, data: bytes | None = None) -> subprocess.CompletedProcess:
    """`git [-C cwd] ARGS...` with its output captured as bytes (`data`: its standard input)."""
    cmd = ["git", *(["-C", str(cwd)] if cwd is not None else []), *args]
    if data is None:
        return interrupt.run(cmd, capture_output=True, stdin=subprocess.DEVNULL)
    return interrupt.run(cmd, capture_output=True, input=data)


def file_versions(root: Path, rel: str, limit: int = 50) -> list[str]:
    """The committed texts of `rel` (newest first) if `root` is in a git work tree, else []."""
    if not available():
        return []
    log = run("log", f"-n{limit}", "--format=%H", "--", rel, cwd=root)
    if log.returncode != 0:
        return []
    out = []
    for commit in log.stdout.decode().split():
        show = run("show", f"{commit}:./{rel}", cwd=root)
        if show.returncode == 0:
            with contextlib.suppress(UnicodeDecodeError):
                out.append(show.stdout.decode())
    return out


def dirty_files(root: Path) -> list[str] | None:
    """Files with uncommitted changes under `root` if it is in a git work tree, else None (no git,
    or not a repository: nothing to compare with)."""
    if not available():
        return None
    inside = run("rev-parse", "--is-inside-work-tree", cwd=root)
    if inside.returncode != 0 or inside.stdout.decode().strip() != "true":
        return None
    status = run("status", "--porcelain", "--untracked-files=all", "--", ".", cwd=root)
    if status.returncode != 0:
        return None
    lines = status.stdout.decode(errors="replace").splitlines()
    return [line[3:] for line in lines if line[3:] and not line[3:].endswith(".backendgen.lock")]


def merge_file(paths: list[str], labels: tuple[str, str, str], marker_size: int) -> subprocess.CompletedProcess:
    """`git merge-file -p --diff3` of the files `paths` (ours, base, theirs): the merged text on
    stdout, the number of conflicts as the exit status (negative, or above 127, on an error)."""
    label_args = [arg for label in labels for arg in ("-L", label)]
    return run("merge-file", "-p", "--diff3", f"--marker-size={marker_size}", *label_args, *paths)
