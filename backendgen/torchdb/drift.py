"""Schema drift: how an operator a project recorded stands in the installed torch.

One classification serves `check` (its schema findings), `check --accept` (it records only drift
that leaves the C++ types alone) and `update --torch` (what it can fix). A recorded operator is
compared by its schema and by the types of its C++ signature, which decide whether its kernel
still compiles; argument names do not.
"""

from __future__ import annotations

from backendgen.plumbing.textenum import TextEnum
from backendgen.torchdb.opdb import Op


class Drift(TextEnum):
    UNCHANGED = "unchanged"
    # the schema's text changed (argument names, defaults), its C++ types did not: the kernel still
    # compiles, its semantics want a look
    SCHEMA_CHANGED = "schema_changed"
    SIGNATURE_CHANGED = "signature_changed"  # the C++ types changed: the kernel must be ported
    REMOVED = "removed"  # the installed torch has no such operator


def classify(recorded_signature: str, op: Op | None, *, schema_unchanged: bool) -> Drift:
    """The drift of a recorded operator whose installed form is `op` (None: not found).
    `schema_unchanged`: whether the caller's comparison of the two schemas found them equal (check
    compares canonical strings from the live dispatcher, update the records)."""
    if op is None:
        return Drift.REMOVED
    if schema_unchanged:
        return Drift.UNCHANGED
    if signature_types(recorded_signature) == signature_types(op.signature):
        return Drift.SCHEMA_CHANGED
    return Drift.SIGNATURE_CHANGED


def _arguments(signature: str) -> tuple[str, list[str]]:
    """A C++ signature's return type and its argument declarations (split at top-level commas)."""
    ret_and_name, _, args = signature.partition("(")
    parts, depth, cur = [], 0, ""
    for ch in args.rstrip().removesuffix(")"):
        depth += 1 if ch in "<(" else -1 if ch in ">)" else 0
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return ret_and_name.rsplit(" ", 1)[0].strip(), [p.strip() for p in parts]


def signature_types(signature: str) -> str:
    """A C++ signature without its name and argument names: what decides whether a kernel still fits."""
    ret, args = _arguments(signature)
    return f"{ret}({', '.join(a.rsplit(' ', 1)[0].strip() for a in args)})"


def argument_names(signature: str) -> list[str]:
    """The names of a C++ signature's arguments, in order."""
    return [a.rsplit(" ", 1)[-1] for a in _arguments(signature)[1]]
