"""The device module's contract: which attributes of `torch.<device>` PyTorch's own Python reads.

PyTorch's generic code reaches a backend through its device module (`torch.cuda`, `torch.xpu`,
`torch.<device>`): `torch.utils.checkpoint` saves the device's RNG state only when
`getattr(device_module, "_initialized", False)` is true, AOTAutograd asks for `_get_generator`,
serialization for `_utils._get_device_index`, FSDP for `memory_summary`. A missing attribute is
rarely an error: most reads have a silent default, so the bug is a wrong result (checkpointing
redraws dropout masks). The template's device module answers every such read of the torch it
was tested with (template.json "device_module"); this module finds the reads of the installed
torch, so `backendgen check` names an attribute a newer torch starts reading that the device
module lacks.

How reads are found: torch's Python files are parsed (ast) and every attribute taken of an
expression that is a device module — a variable conventionally named so (`device_module`,
`device_mod`, `_device_handle`, ...), `_get_device_module(...)` / `torch.get_device_module(...)`,
or `getattr(torch, <not a constant>)` — is recorded with where it is read, including `getattr` /
`hasattr` with a constant name and one level of nesting (`_utils._get_device_index`). Reads that
concern no PrivateUse1 device are listed with the reason in the manifest ("not_needed").
The scan takes a few seconds; its result is cached per torch installation.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from pathlib import Path

from backendgen.plumbing.files import write_atomic

# names PyTorch's code gives a device module (variables and attributes)
MODULE_NAMES = frozenset(
    {
        "device_module",
        "device_mod",
        "torch_device_module",
        "device_handle",
        "_device_mod",
        "_device_handle",
        "_device_module",
    }
)
# calls that return a device module
FACTORIES = frozenset({"_get_device_module", "get_device_module"})
# text a file must hold to be parsed at all (parsing all of torch costs ~15 s; these few hundred, ~2 s)
_TRIGGERS = tuple(MODULE_NAMES | FACTORIES | {"getattr(torch, "})
CACHE_FORMAT = 1


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_device_module(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in MODULE_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in MODULE_NAMES
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name in FACTORIES:
            return True
        return (
            name == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "torch"
            and not isinstance(node.args[1], ast.Constant)
        )
    return False


def _reads_in(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _is_device_module(node.value):
                out.append((node.attr, node.lineno))
            elif isinstance(node.value, ast.Attribute) and _is_device_module(node.value.value):
                out.append((f"{node.value.attr}.{node.attr}", node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and _is_device_module(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            out.append((node.args[1].value, node.lineno))
    return out


def scan(torch_dir: Path) -> dict[str, list[str]]:
    """{attribute: ["path/in/torch.py:LINE", ...]} for every device-module attribute torch's Python reads.
    Attributes whose name the scan mistakes for one (an assignment target's own attribute) are rare;
    the manifest's "not_needed" lists any that are not device-module reads, with the reason."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(torch_dir.rglob("*.py")):
        rel = path.relative_to(torch_dir).as_posix()
        if rel.startswith("testing/"):
            continue  # PyTorch's test helpers are not what a user's program runs
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if not any(t in text for t in _TRIGGERS):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for name, line in _reads_in(tree):
            if not name.startswith("__"):
                found[name].append(f"{rel}:{line}")
    return dict(sorted(found.items()))


def torch_reads(torch_dir: Path, torch_version: str) -> dict[str, list[str]]:
    """`scan` of the installed torch, cached per torch version and installation."""
    from backendgen.torchdb.opdb import cache_dir

    stamp = (torch_dir / "__init__.py").stat().st_mtime_ns if (torch_dir / "__init__.py").exists() else 0
    path = cache_dir() / f"device-module-reads-{torch_version}.json"
    try:
        cached = json.loads(path.read_text())
        if (
            cached.get("format") == CACHE_FORMAT
            and cached.get("dir") == str(torch_dir)
            and cached.get("stamp") == stamp
        ):
            return cached["reads"]
    except (OSError, ValueError, AttributeError):
        pass
    reads = scan(torch_dir)
    try:
        write_atomic(path, json.dumps({"format": CACHE_FORMAT, "dir": str(torch_dir), "stamp": stamp, "reads": reads}))
    except OSError:
        pass  # an unwritable cache only costs time
    return reads


def required(reads: dict[str, list[str]], not_needed: dict[str, str]) -> dict[str, list[str]]:
    """The reads a device module must answer: all but those the manifest says concern no PrivateUse1 device."""
    return {name: where for name, where in reads.items() if name not in not_needed}


def main(argv: list[str] | None = None) -> int:
    """`python -m backendgen.project.devmodule`: print what the installed torch reads from a device module."""
    from backendgen.plumbing.environment import installed_torch

    torch = installed_torch()
    if torch.torch_dir is None:
        print("torch is not installed")
        return 2
    for name, where in scan(torch.torch_dir).items():
        print(f"{name:32} {len(where):3}  {', '.join(where[:3])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
