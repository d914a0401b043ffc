"""Three-way merging of one text file: what the older template wrote (base), what the project has
now (ours: the team's edits) and what the current template writes (theirs).

`merge3` uses `git merge-file` when git is installed (its diff is the one teams know from their
own merges) and a line-based diff3 of its own otherwise (difflib's matching blocks intersected,
as diff3 does); both mark a conflict the same way, diff3-style, so the base is visible:

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


def _sync_regions(base: list[str], a: list[str], b: list[str]) -> list[tuple[int, int, int, int, int, int]]:
    """Regions of `base` unchanged in both `a` and `b`: (base start, end, a start, end, b start, end)."""
    am = difflib.SequenceMatcher(None, base, a, autojunk=False).get_matching_blocks()
    bm = difflib.SequenceMatcher(None, base, b, autojunk=False).get_matching_blocks()
    ia = ib = 0
    regions = []
    while ia < len(am) and ib < len(bm):
        abase, amatch, alen = am[ia]
        bbase, bmatch, blen = bm[ib]
        start, end = max(abase, bbase), min(abase + alen, bbase + blen)
        if start < end:
            asub, bsub = amatch + (start - abase), bmatch + (start - bbase)
            regions.append((start, end, asub, asub + end - start, bsub, bsub + end - start))
        if abase + alen < bbase + blen:
            ia += 1
        else:
            ib += 1
    regions.append((len(base), len(base), len(a), len(a), len(b), len(b)))
    return regions


def _py_merge(base: str, ours: str, theirs: str, labels: tuple[str, str, str]) -> MergeResult:
    o, a, b = _lines(base), _lines(ours), _lines(theirs)
    out: list[str] = []
    conflicts = 0
    iz = ia = ib = 0

    def block(lines: list[str]) -> list[str]:
        if lines and not lines[-1].endswith("\n"):
            return lines[:-1] + [lines[-1] + "\n"]
        return lines

    for zstart, zend, astart, aend, bstart, bend in _sync_regions(o, a, b):
        a_part, b_part, base_part = a[ia:astart], b[ib:bstart], o[iz:zstart]
        if a_part or b_part:
            if a_part == b_part or b_part == base_part:
                out += a_part
            elif a_part == base_part:
                out += b_part
            else:
                conflicts += 1
                out += [
                    f"{'<' * MARKER_SIZE} {labels[0]}\n",
                    *block(a_part),
                    f"{'|' * MARKER_SIZE} {labels[1]}\n",
                    *block(base_part),
                    f"{'=' * MARKER_SIZE}\n",
                    *block(b_part),
                    f"{'>' * MARKER_SIZE} {labels[2]}\n",
                ]
        out += o[zstart:zend]
        iz, ia, ib = zend, aend, bend
    return MergeResult("".join(out), conflicts)
