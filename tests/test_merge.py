"""backendgen.project.merge: the 3-way merge of one file, with git and with its own diff3."""

from __future__ import annotations

import shutil

import pytest

from backendgen.project.merge import has_markers, merge3

BASE = "".join(f"line {i}\n" for i in range(1, 11))
WAYS = [pytest.param(True, id="git"), pytest.param(False, id="python")]


def _edit(text: str, lineno: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[lineno - 1] = new
    return "".join(lines)


@pytest.fixture(params=WAYS)
def use_git(request):
    if request.param and shutil.which("git") is None:
        pytest.skip("git is not installed")
    return request.param


def test_edits_on_both_sides_in_different_places_merge_cleanly(use_git):
    ours = _edit(BASE, 2, "our line 2\n") + "our last line\n"
    theirs = _edit(BASE, 8, "their line 8\n")
    res = merge3(BASE, ours, theirs, use_git=use_git)
    assert res.conflicts == 0
    assert res.text == _edit(_edit(BASE, 2, "our line 2\n"), 8, "their line 8\n") + "our last line\n"
    assert not has_markers(res.text)


def test_overlapping_edits_conflict_with_both_sides_and_the_base_kept(use_git):
    ours = _edit(BASE, 5, "ours 5\n")
    theirs = _edit(BASE, 5, "theirs 5\n")
    res = merge3(BASE, ours, theirs, labels=("yours", "template 3", "template 6"), use_git=use_git)
    assert res.conflicts == 1
    assert "<<<<<<< yours\nours 5\n||||||| template 3\nline 5\n=======\ntheirs 5\n>>>>>>> template 6\n" in res.text
    assert res.text.startswith("line 1\n") and res.text.endswith("line 10\n")
    assert has_markers(res.text)


def test_one_sided_changes_are_taken_whole(use_git):
    changed = _edit(BASE, 3, "x\n")
    assert merge3(BASE, BASE, changed, use_git=use_git).text == changed  # unedited: the template's
    assert merge3(BASE, changed, BASE, use_git=use_git).text == changed  # template unchanged: yours
    assert merge3(BASE, changed, changed, use_git=use_git).text == changed  # the same change twice


def test_a_file_both_sides_added_differently_conflicts(use_git):
    res = merge3("", "a\nb\n", "a\nc\n", use_git=use_git)
    assert res.conflicts == 1 and "b\n" in res.text and "c\n" in res.text


def test_git_and_the_fallback_agree_on_distinct_lines():
    """(On text that repeats itself the fallback may align differently and conflict where git does
    not: it then keeps both sides, never loses a line.)"""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = "".join(f"line {i}\n" for i in range(1, 31))
    ours = _edit(_edit(base, 2, "o2\n"), 25, "o25\n")
    theirs = _edit(_edit(base, 12, "t12\n"), 25, "t25\n")
    a, b = merge3(base, ours, theirs, use_git=True), merge3(base, ours, theirs, use_git=False)
    assert (a.text, a.conflicts) == (b.text, b.conflicts) and a.conflicts == 1
