"""The house rules of backendgen's own code (issue #46): no function longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "backendgen"
LONGEST = 80  # lines, from a function's first decorator (or its `def`) to its last line

# Functions allowed to be longer for now, as "kinds.customop.parse" (a method: "module.Class.method").
# Empty: customop.parse and opdb._derive_ops, the last two, were split by their owner (issue #46).
ALLOWED: frozenset[str] = frozenset()


def _functions(tree: ast.AST, prefix: str):
    """(qualified name, first line, last line) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield f"{prefix}{node.name}", first, node.end_lineno
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def _lengths() -> dict[str, tuple[str, int]]:
    """{"package.module.function": (where, lines)} of every function in backendgen/ (the module
    as imported below backendgen, e.g. "kinds.customop.parse")."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        for name, first, last in _functions(ast.parse(path.read_text(), filename=rel), f"{module}."):
            found[name] = (f"{rel}:{first}", last - first + 1)
    return found


def test_the_walk_measures_decorated_functions_methods_and_nested_ones():
    source = "@a\n@b(1)\ndef f():\n    def g():\n        pass\n\n\nclass C:\n    def m(self):\n        return 1\n"
    assert list(_functions(ast.parse(source), "mod.")) == [("mod.f", 1, 5), ("mod.f.g", 4, 5), ("mod.C.m", 9, 10)]


def test_no_function_is_longer_than_80_lines():
    lengths = _lengths()
    too_long = [
        f"{name} ({where}): {lines} lines"
        for name, (where, lines) in sorted(lengths.items())
        if lines > LONGEST and name not in ALLOWED
    ]
    assert not too_long, f"longer than {LONGEST} lines: split along its steps:\n" + "\n".join(too_long)
    stale = sorted(name for name in ALLOWED if lengths.get(name, ("", 0))[1] <= LONGEST)
    assert not stale, f"allowed but no longer over {LONGEST} lines (or gone): drop from ALLOWED: {stale}"
