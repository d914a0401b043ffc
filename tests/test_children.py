"""Every child process backendgen starts goes through backendgen/plumbing/interrupt.py (a process
group of its own, stopped when the command is interrupted or fails), and every git command through
backendgen/plumbing/git.py. A direct call anywhere else fails here until it moves there, or is
listed in ALLOWED with the reason it must not."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "backendgen"
RUNNER = "plumbing/interrupt.py"
GIT = "plumbing/git.py"
STARTERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
}
ALLOWED = {
    ("commands/profile.py", "run"): "the user's script runs in the terminal's process group, as `python "
    "script.py` would: Ctrl-C reaches the script, and the runner still writes what ran",
}


def _functions(tree: ast.AST):
    """(enclosing function's name, node) for every node of `tree` ('<module>' outside functions)."""

    def walk(node, name):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            yield inner, child
            yield from walk(child, inner)

    yield from walk(tree, "<module>")


def _scan() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(direct process starts, git commands built outside GIT): (file, function) pairs."""
    starts, gits = set(), set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for func, node in _functions(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in STARTERS:
                if {a.name for a in node.names} & STARTERS[node.module] and rel != RUNNER:
                    starts.add((rel, func))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.attr in STARTERS.get(node.func.value.id, ())
                and rel != RUNNER
            ):
                starts.add((rel, func))
            if (
                isinstance(node, ast.List)
                and node.elts
                and isinstance(node.elts[0], ast.Constant)
                and node.elts[0].value == "git"
                and rel != GIT
            ):
                gits.add((rel, func))
    return starts, gits


def test_every_child_process_starts_in_the_runner():
    starts, _ = _scan()
    assert set(ALLOWED) <= starts, "the scan no longer finds the calls it allows (a scan that finds nothing passes)"
    direct = sorted(starts - set(ALLOWED))
    assert not direct, (
        f"started outside backendgen/{RUNNER} (use interrupt.run or interrupt.popen, or list it in ALLOWED "
        f"with the reason): {direct}"
    )


def test_every_git_command_is_in_the_git_module():
    _, gits = _scan()
    assert not sorted(gits), f"git run outside backendgen/{GIT}: {sorted(gits)}"
