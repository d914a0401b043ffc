"""Three-way merging of one text file: what the older template wrote (base), what the project has
now (ours: the team's edits) and what the current template writes (theirs).

`merge3` uses `git merge-file` when git is installed (its diff is the one teams know from their
own merges) and otherwise the `merge3` package's line-based diff3 (breezy's: difflib's matching
blocks intersected, as diff3 does); both mark a conflict the same way, diff3-style, so the base is
visible:

    <<<<<<< yours
    the project's lines
    ||||||| template 5
    the older template's lines
    =======
    the current template's lines
    >>>>>>> template 6
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass

from backendgen.plumbing import git

MARKER_SIZE = 7


@dataclass
class MergeResult:
    text: str
    conflicts: int  # number of conflicting regions (0: a clean merge)


def merge3(
    base: str,
    ours: str,
    theirs: str,
    *,
    labels: tuple[str, str, str] = ("yours", "base", "theirs"),
    use_git: bool | None = None,
) -> MergeResult:
    """Merge the change base -> theirs into ours. `labels`: (ours, base, theirs) for the markers.
    `use_git`: None picks git when it is on PATH."""
    if ours == theirs or base == theirs:
        return MergeResult(ours, 0)
    if base == ours:
        return MergeResult(theirs, 0)
    if use_git is None:
        use_git = git.available()
    if use_git:
        return _git_merge(base, ours, theirs, labels)
    return _py_merge(base, ours, theirs, labels)


def has_markers(text: str) -> bool:
    """Whether `text` still holds a conflict this module wrote (a line starting with the markers)."""
    starts = ("<" * MARKER_SIZE + " ", ">" * MARKER_SIZE + " ")
    return any(line.startswith(starts) for line in text.splitlines())


def _git_merge(base: str, ours: str, theirs: str, labels: tuple[str, str, str]) -> MergeResult:
    with tempfile.TemporaryDirectory(prefix="backendgen-merge-") as tmp:
        paths = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = os.path.join(tmp, name)
            with open(path, "w", newline="") as fh:
                fh.write(text)
            paths.append(path)
        proc = git.merge_file(paths, labels, MARKER_SIZE)
    if proc.returncode < 0 or proc.returncode > 127:  # git merge-file: >= 0 conflicts, negative on error
        raise RuntimeError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return MergeResult(proc.stdout.decode(), proc.returncode)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _py_merge(base: str, ours: str, theirs: str, labels: tuple[str, str, str]) -> MergeResult:
    """diff3 without git: the `merge3` package's regions (breezy's Merge3: difflib's matching blocks
    of base against each side, intersected), written here so that a conflict reads as git's does
    (markers end in "\n" whatever the file's line ends; a side's last line gets its newline)."""
    from merge3 import Merge3

    o, a, b = _lines(base), _lines(ours), _lines(theirs)
    out: list[str] = []
    conflicts = 0

    def block(lines: list[str]) -> list[str]:
        if lines and not lines[-1].endswith("\n"):
            return lines[:-1] + [lines[-1] + "\n"]
        return lines

    regions = Merge3(o, a, b, sequence_matcher=_exact_matcher).merge_regions()
    for what, *at in regions:
        if what == "unchanged":
            out += o[at[0] : at[1]]
        elif what in ("a", "same"):
            out += a[at[0] : at[1]]
        elif what == "b":
            out += b[at[0] : at[1]]
        else:  # "conflict": base, ours, theirs ranges
            zstart, zend, astart, aend, bstart, bend = at
            conflicts += 1
            out += [
                f"{'<' * MARKER_SIZE} {labels[0]}\n",
                *block(a[astart:aend]),
                f"{'|' * MARKER_SIZE} {labels[1]}\n",
                *block(o[zstart:zend]),
                f"{'=' * MARKER_SIZE}\n",
                *block(b[bstart:bend]),
                f"{'>' * MARKER_SIZE} {labels[2]}\n",
            ]
    return MergeResult("".join(out), conflicts)


def _exact_matcher(junk, x, y) -> difflib.SequenceMatcher:
    """difflib's matcher without its popular-line heuristic (which would misalign files of more than
    200 lines that repeat a line, such as a blank one)."""
    return difflib.SequenceMatcher(junk, x, y, autojunk=False)
