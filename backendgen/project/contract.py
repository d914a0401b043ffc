"""Holds a template to its manifest (backendgen/project/manifest.py): what a template developer forgot.

`audit(template)` reads the template's sources as text and returns one line per problem:
- a source file no integration point owns (a new integration point without its manifest entry),
  or one two points claim equally;
- a path of the manifest that is neither in the template nor a place backendgen generates into;
- a registration in the C++ (`m.impl`, `m.fallback`, `m.def`, a static registration macro) that
  its integration point's entry does not list, or a listed one the C++ does not make;
- a torch API an entry names that none of its files (or add-op's kernel templates) uses;
- a C++ file, or a folder backendgen generates C++ into, that no unity group of the template's
  `setup.py` (`GROUPS`) compiles, or a `setup.py` without the command `build` names;
- a name generated kernels call (`kernels::NAME` in backendgen's generators and `template/ops/`)
  that no integration point `provides`, or a provided one its files do not declare;
- a file that includes the emulator's own header (`emulator.header`) without being one of the
  manifest's `emulator.users`, generated code that reaches the emulator, or a listed user that is
  missing, is a header, or no longer includes it;
- a file outside `csrc/driver/` that includes more of the driver than `driver/driver.h`, the port
  API (`driver_includes`): the emulator's `emulator.h`, or any other file of `csrc/driver/`;
- a driver (the manifest's `drivers`) whose files are not in the template.
The template is audited as each of its drivers lays it out (backendgen.project.drivers): the tree
a project made with `--driver minimal` has is held to the manifest too.

`audit_project(root)` holds a generated project to the rule of the driver's includes (`backendgen
check` reports the same). `api_problems(manifest)` checks that every API the manifest names exists
in the installed torch. tests/test_manifest.py runs them; `python -m backendgen.project.contract
[DIR]` prints the problems of the template (or of the template or generated project DIR).
"""

from __future__ import annotations

import ast
import fnmatch
import os
import posixpath
import re
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from backendgen.project import drivers, template_tree
from backendgen.project.manifest import MANIFEST_FILE, IntegrationPoint, Manifest, parse, read, template_dir

PROJECT_DIR = "{{cookiecutter.dist_name}}"
_PACKAGE = "{{cookiecutter.package}}"
# what an integration point owns: the C++ and the package (the rest is the project's scaffolding:
# setup.py, tests, examples, README)
_OWNED = re.compile(r"^(csrc/|\{package\}/|\{package\}_autoload\.py$)")

_BLOCK = re.compile(r"\b(TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT|TORCH_LIBRARY)\s*\(([^)]*)\)\s*\{(.*?)\n\}", re.S)
_IMPL = re.compile(r"\bm\.impl\(\s*\"([^\"]+)\"")
_DEF = re.compile(r"\bm\.def\(\s*\"([A-Za-z0-9_.]+)")
_FALLBACK = re.compile(r"\bm\.fallback\(")
_STATIC = re.compile(
    r"\b([A-Z0-9_]*REGISTER_[A-Z0-9_]+|Register\w+|register\w*PrivateUse1\w*|TensorBackendMetaRegistry)\s*\("
)
_COMMENT = re.compile(r"//[^\n]*")
_NAMESPACE = {"{{ cookiecutter.package }}": "{package}", "{{cookiecutter.package}}": "{package}"}


def project_files(template: Path, driver: str | None = None) -> dict[str, Path]:
    """The template project's files by project path, `{package}` for the package's name: the tree
    as it is (the default driver's), or as `driver` lays it out (backendgen.project.drivers)."""
    listing = {rel: template / rel for rel in template_tree.paths(template)}
    if driver is not None:
        listing = drivers.arrange(listing, read(template), driver)
    prefix = PROJECT_DIR + "/"
    return {
        rel.removeprefix(prefix).replace(_PACKAGE, "{package}"): path
        for rel, path in sorted(listing.items())
        if rel.startswith(prefix)
    }


def registrations(cpp: str) -> tuple[dict[str, set[str]], set[str], set[str]]:
    """What C++ source `cpp` registers: (dispatch key -> operators, defined operators, static
    registrations). Operators as `ns::name`; a fallback is `_::fallback`."""
    cpp = _COMMENT.sub("", cpp)
    registers: dict[str, set[str]] = defaultdict(set)
    defines: set[str] = set()
    for macro, args, body in _BLOCK.findall(cpp):
        parts = [_NAMESPACE.get(a.strip(), a.strip()) for a in args.split(",")]
        if macro == "TORCH_LIBRARY_IMPL":
            ns, key = parts[0], parts[1]
            registers[key] |= {f"{ns}::{name}" for name in _IMPL.findall(body)}
            if _FALLBACK.search(body):
                registers[key].add(f"{ns}::fallback")
        else:
            defines |= {f"{parts[0]}::{name}" for name in _DEF.findall(body)}
    statics = {m for m in _STATIC.findall(_BLOCK.sub("", cpp)) if not m.startswith("TORCH_LIBRARY")}
    return dict(registers), defines, statics


def _owners(m: Manifest, path: str) -> list[IntegrationPoint]:
    best = max(p.specificity(path) for p in m.integration_points)
    return [p for p in m.integration_points if best and p.specificity(path) == best]


def audit(template: Path | None = None) -> list[str]:
    """The template's problems: as the default driver has it, then what another driver's layout adds
    (each such line says which driver)."""
    template = Path(template) if template is not None else template_dir()
    m = parse(read(template))
    problems = _driver_files(template, m)
    if problems:
        return problems  # a driver's file is missing: its layout cannot be audited
    problems = _audit_files(template, project_files(template), m, m.default_driver)
    for driver in list(m.drivers)[1:]:
        found = _audit_files(template, project_files(template, driver), m, driver)
        problems += [f"with --driver {driver}: {p}" for p in found if p not in problems]
    return problems


def _driver_files(template: Path, m: Manifest) -> list[str]:
    """Each driver's files are in the template: the default's in the project tree, another's anywhere."""
    problems = []
    for driver in m.drivers.values():
        for path, source in driver.files.items():
            if driver.name == m.default_driver and source != f"{PROJECT_DIR}/{path}":
                problems.append(f"drivers: {driver.name}, the default, has its {path} outside the project tree")
            elif not (template / source).is_file():
                problems.append(
                    f"drivers: {driver.name}: {source} (its {path}) is in {MANIFEST_FILE} but not in the template"
                )
    return problems


def _audit_files(template: Path, files: dict[str, Path], m: Manifest, driver: str) -> list[str]:
    """The problems of one layout of the template's project tree (`files`, by project path)."""
    owned, problems = _ownership(files, m)
    problems += _listed_paths(files, m)
    problems += _uncompiled(files, m)
    problems += _setup_protocol(files, m)
    problems += _provided(template, files, m)
    if driver == m.default_driver:  # the emulator's header is its own: another driver's layout has none
        problems += _emulator_users(template, files, m)
    problems += [str(found) for found in driver_includes(files)]
    problems += missing_driver_files(files)
    for point in m.integration_points:
        texts = {path: files[path].read_text(errors="replace") for path in owned[point.name]}
        problems += _point_registrations(point, texts)
        problems += _point_apis(template, point, texts)
    return problems


def _ownership(files: dict[str, Path], m: Manifest) -> tuple[dict[str, list[str]], list[str]]:
    """Each file the manifest must account for, owned by exactly one integration point:
    ({point name: its files}, the problems)."""
    problems = []
    owned: dict[str, list[str]] = defaultdict(list)  # point name -> its files
    for path in files:
        if not _OWNED.match(path) or path in m.shared_files:
            continue
        owners = _owners(m, path)
        if not owners:
            problems.append(
                f"{path}: no integration point owns it; add one to {MANIFEST_FILE} (or the file to an entry)"
            )
        elif len(owners) > 1:
            problems.append(f"{path}: owned by {' and '.join(p.name for p in owners)} alike; make one entry name it")
        else:
            owned[owners[0].name].append(path)
    return owned, problems


def _listed_paths(files: dict[str, Path], m: Manifest) -> list[str]:
    """Every path an integration point lists is in the template (but where backendgen writes)."""
    problems = []
    generated = tuple(m.paths.values())  # where backendgen writes (add-op's kernels, ...)
    for point in m.integration_points:
        for path in (*point.paths, *point.more_files):
            if "<" in path or path.startswith(generated):
                continue
            pattern = path + "*" if path.endswith("/") else path
            if not any(fnmatch.fnmatchcase(f, pattern) for f in files):
                problems.append(f"{point.name}: {path} is in {MANIFEST_FILE} but not in the template")
    return problems


def _both_ways(made: set[str], listed: set[str], unlisted, unmade) -> list[str]:
    """What the files make that the manifest does not list (`unlisted`'s message for each), then what
    it lists that they do not make (`unmade`'s), each sorted."""
    return [unlisted(x) for x in sorted(made - listed)] + [unmade(x) for x in sorted(listed - made)]


def _point_registrations(point: IntegrationPoint, texts: dict[str, str]) -> list[str]:
    """What a point's C++ files register, define and register statically, against what the manifest lists."""
    problems = []
    found_reg: dict[str, set[str]] = defaultdict(set)
    found_def: set[str] = set()
    found_static: set[str] = set()
    for path, text in texts.items():
        if path.endswith((".cpp", ".h")):
            reg, defs, statics = registrations(text)
            for key, ops in reg.items():
                found_reg[key] |= ops
            found_def |= defs
            found_static |= statics
    for key in sorted(set(found_reg) | set(point.registers)):
        problems += _both_ways(
            found_reg.get(key, set()),
            set(point.registers.get(key, ())),
            lambda op, key=key: f"{point.name}: registers {op} at {key}, which {MANIFEST_FILE} does not list",
            lambda op, key=key: f"{point.name}: {MANIFEST_FILE} lists {op} at {key}, which its files do not register",
        )
    problems += _both_ways(
        found_def,
        set(point.defines),
        lambda op: f"{point.name}: defines {op}, which {MANIFEST_FILE} does not list",
        lambda op: f"{point.name}: {MANIFEST_FILE} lists the definition of {op}, which its files do not make",
    )
    problems += _both_ways(
        found_static,
        set(point.statics),
        lambda s: f"{point.name}: static registration {s} is not in {MANIFEST_FILE}",
        lambda s: f"{point.name}: {MANIFEST_FILE} lists the static registration {s}, which its files do not make",
    )
    return problems


def _point_apis(template: Path, point: IntegrationPoint, texts: dict[str, str]) -> list[str]:
    """The C++ and Python APIs a point names are the ones its files use (add-op's kernels: the kernel templates)."""
    used = (
        "\n".join(texts.values())
        if texts
        else "\n".join(p.read_text(errors="replace") for p in sorted((template / "ops").glob("*.j2")))
    )
    problems = []
    for header, names in point.cpp_apis.items():
        problems += [
            f"{point.name}: {MANIFEST_FILE} names {header}: {n}, which its files do not use"
            for n in names
            if not re.search(rf"\b{re.escape(n)}\b", used)
        ]
    problems += [
        f"{point.name}: {MANIFEST_FILE} names {n}, which its files do not use"
        for n in point.python_apis
        if n.rsplit(".", 1)[-1] not in used
    ]
    return problems


def _setup_protocol(files: dict[str, Path], m: Manifest) -> list[str]:
    """The command backendgen runs to list a build's sources (build.BuildRecord.units_still_match)."""
    text = files["setup.py"].read_text() if "setup.py" in files else ""
    command, prefix = m.build["sources_command"], m.build["sources_prefix"].strip()
    problems = []
    if not re.search(rf"cmdclass=\{{[^}}]*\"{re.escape(command)}\":", text):
        problems.append(f"setup.py: no `{command}` command in its cmdclass ({MANIFEST_FILE} build.sources_command)")
    if f'print("{prefix}"' not in text:
        problems.append(
            f"setup.py: its `{command}` command does not print {prefix!r} ({MANIFEST_FILE} build.sources_prefix)"
        )
    return problems


_KERNEL_NAME = re.compile(r"(?:\{K\}|kernels)::([A-Za-z_]\w*)")


def _generators(template: Path) -> list[Path]:
    """What writes a project's generated C++: backendgen's modules and the kernel templates."""
    here = Path(__file__).resolve()
    package = here.parent.parent  # backendgen/
    return [
        *(p for p in sorted(package.rglob("*.py")) if p.name not in (here.name, "manifest.py")),
        *sorted((template / "ops").glob("*.j2")),
    ]


def _provided(template: Path, files: dict[str, Path], m: Manifest) -> list[str]:
    """Names generated code calls in the template's kernel helpers, against the points' `provides`."""
    called = {name for path in _generators(template) for name in _KERNEL_NAME.findall(path.read_text())}
    provided = {name: point for point in m.integration_points for name in point.provides}
    problems = [
        f"generated code calls kernels::{name}, which no integration point provides"
        for name in sorted(called - set(provided))
    ]
    for name, point in provided.items():
        texts = [files[f].read_text() for f in files if point.specificity(f) and f.endswith(".h")]
        if not any(re.search(rf"\b{re.escape(name)}\b", t) for t in texts):
            problems.append(f"{point.name}: provides {name}, which its headers do not declare")
    return problems


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)


def _emulator_users(template: Path, files: dict[str, Path], m: Manifest) -> list[str]:
    """Who includes the emulator's own header: the files the manifest lists, and nothing generated."""
    if m.emulator is None:
        return []
    header, users = m.emulator.header, m.emulator.users

    def includes(path: str) -> bool:  # an include is relative to csrc/ (the include dir) or to the file
        spelled = _INCLUDE.findall(_COMMENT.sub("", files[path].read_text(errors="replace")))
        return any(
            header in (posixpath.normpath(f"csrc/{s}"), posixpath.normpath(posixpath.join(posixpath.dirname(path), s)))
            for s in spelled
        )

    if header not in files:
        return [f"emulator: {header} is in {MANIFEST_FILE} but not in the template"]
    problems = []
    including = {f for f in files if f != header and f.endswith((".cpp", ".h")) and includes(f)}
    problems += [
        f"{f}: includes {header}, the emulator's own calls; only the files {MANIFEST_FILE} lists in "
        f"emulator.users may (the rest reach the device through driver.h, kernels through kernel_support.h)"
        for f in sorted(including - set(users))
        if f.startswith(DRIVER_DIR)  # (one outside the driver: driver_includes names it)
    ]
    for user in users:
        if user not in files:
            problems.append(f"emulator: {user} is a user in {MANIFEST_FILE} but not in the template")
        elif not user.startswith(DRIVER_DIR):
            problems.append(f"emulator: {user} is outside {DRIVER_DIR}: the emulator's header is the driver's own")
        elif not user.endswith(".cpp"):
            problems.append(f"emulator: {user} is a header: every file that includes it would reach the emulator")
        elif user not in including:
            problems.append(f"emulator: {user} is a user in {MANIFEST_FILE} but does not include {header}")
    name = posixpath.basename(header)
    problems += [
        f"{path.parent.name}/{path.name}: generated code reaches the emulator ({name} or emulator::); "
        "generated kernels use "
        f"kernels:: helpers (kernel_support.h)"
        for path in _generators(template)
        if name in (text := path.read_text()) or "emulator::" in text
    ]
    return problems


DRIVER_DIR = "csrc/driver/"
PORT_API = "csrc/driver/driver.h"
_CPP_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".h", ".hh", ".hpp", ".hxx", ".inc", ".inl", ".ipp", ".tpp")


@dataclass(frozen=True)
class DriverInclude:
    """A file outside csrc/driver that includes more of the driver than the port API."""

    path: str  # the including file, by project path
    spelled: str  # as its #include spells it
    target: str  # the driver file it reaches, by project path

    @property
    def message(self) -> str:
        return (
            f'includes "{self.spelled}" ({self.target}): outside {DRIVER_DIR} nothing includes more of the '
            "driver than driver/driver.h, the port API"
        )

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_INCLUDE_SPELLED = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


def _include_targets(path: str, spelled: str) -> list[str]:
    """Where `#include "spelled"` (or `<spelled>`, spelled with its `<`) in project file `path` may
    lead: relative to csrc/ (the include directory), or, quoted, to the file's own folder."""
    if spelled.startswith("<"):
        return [posixpath.normpath(f"csrc/{spelled[1:]}")]
    return list(
        dict.fromkeys(
            [
                posixpath.normpath(f"csrc/{spelled}"),
                posixpath.normpath(posixpath.join(posixpath.dirname(path), spelled)),
            ]
        )
    )


def _includes(files: Mapping[str, Path], *, outside_driver: bool = False):
    """(path, spelled) of every #include of the C/C++ files of `files` (of those outside csrc/driver);
    an angle-bracket include spelled with its `<`."""
    for path, file in sorted(files.items()):
        if not path.endswith(_CPP_SUFFIXES) or (outside_driver and path.startswith(DRIVER_DIR)):
            continue
        try:
            text = file.read_text(errors="replace")
        except OSError:
            continue  # unreadable: not ours to judge (the build says what is wrong with it)
        for delimiter, spelled in _INCLUDE_SPELLED.findall(_COMMENT.sub("", text)):
            yield path, ("<" + spelled if delimiter == "<" else spelled)


def driver_includes(files: Mapping[str, Path]) -> list[DriverInclude]:
    """The C/C++ files of `files` (project path -> file) outside csrc/driver that include a file of
    csrc/driver other than driver.h: only the port API is the driver's to the rest of the backend."""
    found = []
    for path, spelled in _includes(files, outside_driver=True):
        target = next(
            (t for t in _include_targets(path, spelled) if t.startswith(DRIVER_DIR) and t != PORT_API),
            None,
        )
        if target is not None:
            found.append(DriverInclude(path, spelled.lstrip("<"), target))
    return found


def missing_driver_files(files: Mapping[str, Path]) -> list[str]:
    """Includes of a csrc/driver file that this layout of the template has not (a driver's file
    another driver lacks: the emulator's header in a project made with --driver minimal)."""
    problems = []
    for path, spelled in _includes(files):
        targets = _include_targets(path, spelled)
        if any(t in files for t in targets):
            continue
        for target in (t for t in targets if t.startswith(DRIVER_DIR)):
            problems.append(f'{path}: includes "{spelled.lstrip("<")}" ({target}), which the project lacks')
            break
    return problems


_NOT_SOURCES = frozenset({"build", "dist", "node_modules", "__pycache__"})


def project_sources(root: Path) -> dict[str, Path]:
    """A generated project's C/C++ files by project path: its sources, not what a build or a tool
    made (build/, dist/, *.egg-info, hidden folders)."""
    root = Path(root)
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d not in _NOT_SOURCES and not d.endswith(".egg-info")
        )
        for name in names:
            if name.endswith(_CPP_SUFFIXES):
                path = Path(folder) / name
                found[path.relative_to(root).as_posix()] = path
    return found


def audit_project(root: Path) -> list[str]:
    """A generated project's problems: a file outside csrc/driver that includes more of the driver than driver.h."""
    return [str(found) for found in driver_includes(project_sources(root))]


def _uncompiled(files: dict[str, Path], m: Manifest) -> list[str]:
    """C++ sources (the template's, and the folders backendgen writes into) no group of setup.py's
    GROUPS compiles: a group entry is a folder under csrc/ (its own .cpp files) or one file."""
    setup = files.get("setup.py")
    found = re.search(r"^GROUPS = (\{.*?^\})", setup.read_text(), re.S | re.M) if setup else None
    if found is None:
        return ["setup.py: no GROUPS dict of unity groups"]
    entries = {e for group in ast.literal_eval(found.group(1)).values() for e in group}
    sources = [f.removeprefix("csrc/") for f in files if f.startswith("csrc/") and f.endswith(".cpp")]
    folders = [v.removeprefix("csrc/") for v in m.paths.values() if v.startswith("csrc/") and not v.endswith(".cpp")]
    registration = m.paths["registration"].removeprefix("csrc/")
    return [
        f"csrc/{f}: no unity group in setup.py's GROUPS compiles it"
        for f in sources + [registration]
        if f not in entries and f.rsplit("/", 1)[0] not in entries
    ] + [
        f"csrc/{d}/: backendgen writes C++ there but no unity group in setup.py's GROUPS compiles it"
        for d in folders
        if d not in entries
    ]


def api_problems(m: Manifest, torch_dir: Path) -> list[str]:
    """The APIs `m` names that the torch installed at `torch_dir` lacks (imports torch for the
    Python names)."""
    import importlib

    problems = []
    for point in m.integration_points:
        for header, names in point.cpp_apis.items():
            path = torch_dir / "include" / header
            text = path.read_text(errors="replace") if path.is_file() else ""
            problems += [f"{point.name}: {header}: {n}" for n in names if n not in text]
        for source, names in point.python_sources.items():
            path = torch_dir / source
            text = path.read_text(errors="replace") if path.is_file() else ""
            problems += [f"{point.name}: torch/{source}: {n}" for n in names if n not in text]
        for dotted in point.python_apis:
            obj = importlib.import_module("torch")
            for part in dotted.split(".")[1:]:
                obj = getattr(obj, part, None)
                if obj is None:
                    problems.append(f"{point.name}: {dotted}")
                    break
    return problems


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m backendgen.project.contract", description="Audit the template against its manifest."
    )
    parser.add_argument(
        "dir",
        nargs="?",
        type=Path,
        help="a template directory (with cookiecutter.json) or a generated project (with backendgen.json) "
        "[default: the installed template]",
    )
    args = parser.parse_args(argv)
    if args.dir is not None and (args.dir / "backendgen.json").is_file():
        problems, ok = audit_project(args.dir), "the project includes no more of the driver than driver.h"
    elif args.dir is None or (args.dir / "cookiecutter.json").is_file():
        problems, ok = audit(args.dir), "the template keeps its manifest"
    else:
        print(f"error: {args.dir} is neither a template nor a generated project", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    print(ok if not problems else f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
