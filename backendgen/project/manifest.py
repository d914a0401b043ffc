"""The template's manifest (`template/template.json`): the contract between the template and backendgen.

It is the one place that says
- which template this is (`template_version`) and which torch releases it is tested with
  (`torch.tested`) and needs at least (`torch.minimum`);
- the named features an older template lacks (`features`: each with the template version that
  introduced it), so code asks `"common_device" in features_of(version)`, never compares versions;
- where things live in a generated project (`paths`), and how backendgen asks its `setup.py` for
  the sources a build compiles (`build`);
- which files may include the emulator's own header (`emulator`: `header`, `users`), the calls
  that exist only because the emulated device's memory is host memory (not the port API);
- the device drivers a project can be made with (`drivers`, `backendgen new --driver`): each one's
  files, `{project path: template path}`; the first is the default, whose files are the project
  tree's own, and another driver's take their place (backendgen.project.drivers);
- every integration point: the files it owns (`paths`, shown in the generated README, and
  `more_files`), what it does and what a hardware team replaces, the C++ names it provides to
  generated kernels (`provides`), the operators it registers
  (`registers`: dispatch key -> `ns::op`, `_::fallback` for a fallback) and defines (`defines`),
  its static registrations (`statics`), the torch APIs it uses (`cpp_apis`: header -> names;
  `python_apis`: dotted names; `python_sources`: torch source file -> text it must contain), and
  its README texts for a project made with another driver (`by_driver`: driver -> about, replace);
- what `backendgen new` adds through the add-op engine (`default_ops`) and the autocast table a
  project starts with (`default_amp`).

tests/test_manifest.py holds the template to it: every source file belongs to an integration
point, every registration in the C++ is the manifest's and the other way round, and every API it
names exists in the installed torch and is used by the point's files.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from backendgen.plumbing.errors import EnvironmentProblem, UserError

MANIFEST_FILE = "template.json"


def template_dir() -> Path:
    """The template shipped in the wheel, or the repository's `template/` in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the backendgen package
    override = os.environ.get("BACKENDGEN_TEMPLATE_DIR")  # for template developers
    candidates = [Path(override)] if override else [here / "_template", here.parent / "template"]
    for candidate in candidates:
        if (candidate / "cookiecutter.json").is_file():
            return candidate
    raise UserError(f"backendgen's template is missing (looked in {here / '_template'}); reinstall backendgen")


@dataclass(frozen=True)
class Feature:
    name: str
    since: int  # the first template version that has it
    about: str


@dataclass(frozen=True)
class IntegrationPoint:
    name: str
    paths: tuple[str, ...]  # project paths; `{package}`, a trailing `/` (a folder), `*` and `<name>` (any file)
    about: str
    replace: str  # what a hardware team replaces (the generated README's "replace first?" column)
    more_files: tuple[str, ...] = ()  # files it owns that the README row does not name
    provides: tuple[str, ...] = ()  # C++ names generated code calls (kernel_support.h's `kernels::NAME`)
    registers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dispatch key -> "ns::op" / "_::fallback"
    defines: tuple[str, ...] = ()  # operators it defines ("{package}::name")
    statics: tuple[str, ...] = ()  # static registrations (REGISTER_ALLOCATOR, ...)
    cpp_apis: dict[str, tuple[str, ...]] = field(default_factory=dict)  # header under torch/include -> names
    python_apis: tuple[str, ...] = ()  # dotted names under torch
    python_sources: dict[str, tuple[str, ...]] = field(default_factory=dict)  # file under torch/ -> text
    optional: bool = False  # the device works without it (a missing API is a warning, not an error)

    def patterns(self) -> list[str]:
        """fnmatch patterns of the project files it owns (`{package}` left as it is)."""
        out = []
        for p in (*self.paths, *self.more_files):
            p = re.sub(r"<[^>]+>", "*", p)
            out.append(p + "*" if p.endswith("/") else p)
        return out

    def specificity(self, path: str) -> int:
        """How closely it claims `path` (the length of its longest pattern that matches, 0: it does
        not). A header belongs with its source of the same stem (`fallback.h` with `fallback.cpp`)."""
        candidates = [path]
        if path.endswith(".h"):
            candidates.append(path[:-2] + ".cpp")
        return max((len(pat) for pat in self.patterns() for c in candidates if fnmatch.fnmatchcase(c, pat)), default=0)


@dataclass(frozen=True)
class Emulator:
    header: str  # the emulator's own header (`csrc/driver/emulator.h`), beside the port API `driver.h`
    users: tuple[str, ...]  # the only project files that may include it (.cpp files: a header would pass it on)


@dataclass(frozen=True)
class Driver:
    name: str  # `backendgen new --driver NAME`
    about: str
    files: dict[str, str]  # its files: project path -> where the template keeps it


EMULATOR = "emulator"  # the driver of every template before `drivers` (and the default since)


@dataclass(frozen=True)
class Manifest:
    template_version: int
    torch_minimum: str
    torch_tested: tuple[str, ...]
    features: dict[str, Feature]
    paths: dict[str, str]
    build: dict[str, str]  # the project's setup.py protocol: the command that lists its sources, and its line
    shared_files: tuple[str, ...]  # files several integration points use (runtime.h)
    integration_points: tuple[IntegrationPoint, ...]
    default_ops: tuple[str, ...]
    default_amp: dict[str, str]
    # torch.<device> attributes PyTorch's own Python reads (backendgen/project/devmodule.py): those the
    # template's device module answers, and those that concern no PrivateUse1 device, with why
    device_module_provides: tuple[str, ...] = ()
    device_module_not_needed: dict[str, str] = field(default_factory=dict)
    emulator: Emulator | None = None  # None: a template from before the driver/emulator split
    # the drivers a project can be made with, the default first; a template from before `drivers`
    # has one, the emulator, in the project tree
    drivers: dict[str, Driver] = field(default_factory=lambda: {EMULATOR: Driver(EMULATOR, "", {})})

    @property
    def default_driver(self) -> str:
        return next(iter(self.drivers))

    def features_of(self, template_version: int) -> frozenset[str]:
        """The features a project from `template_version` has."""
        return frozenset(f.name for f in self.features.values() if template_version >= f.since)

    def feature(self, name: str) -> Feature:
        return self.features[name]

    @property
    def current_features(self) -> frozenset[str]:
        return self.features_of(self.template_version)

    def path(self, key: str) -> str:
        return self.paths[key]

    def builtin_ops(self) -> list[str]:
        """The ATen operators (without `aten::`) the template registers at PrivateUse1 itself."""
        return [
            op.removeprefix("aten::")
            for p in self.integration_points
            for op in p.registers.get("PrivateUse1", ())
            if op.startswith("aten::")
        ]

    def registering(self, qualified: str) -> IntegrationPoint | None:
        """The integration point whose files register ATen operator `qualified` ("aten::op.overload")
        at PrivateUse1, if the template registers it."""
        return next((p for p in self.integration_points if qualified in p.registers.get("PrivateUse1", ())), None)


def _tuple_map(d: dict | None) -> dict[str, tuple[str, ...]]:
    return {k: tuple(v) for k, v in (d or {}).items()}


def _emulator(data: object) -> Emulator | None:
    if data is None:
        return None
    header = data.get("header") if isinstance(data, dict) else None
    users = data.get("users") if isinstance(data, dict) else None
    if not (isinstance(header, str) and isinstance(users, list) and all(isinstance(u, str) for u in users)):
        raise TypeError(f"{MANIFEST_FILE}: emulator needs a `header` path and a `users` list of paths, not {data!r}")
    return Emulator(header, tuple(users))


def drivers_of(data: dict) -> dict[str, Driver]:
    """The drivers of a template whose manifest (an earlier template's too) is `data`."""
    return _drivers(data.get("drivers"))


def _drivers(data: object) -> dict[str, Driver]:
    if data is None:
        return {EMULATOR: Driver(EMULATOR, "", {})}
    if not (
        isinstance(data, dict)
        and data
        and all(
            isinstance(d, dict)
            and isinstance(d.get("files"), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in d["files"].items())
            for d in data.values()
        )
    ):
        raise TypeError(f"{MANIFEST_FILE}: drivers needs an object of drivers, each with its `files`, not {data!r}")
    return {name: Driver(name, d.get("about", ""), dict(d["files"])) for name, d in data.items()}


def parse(data: dict) -> Manifest:
    """A manifest from the parsed JSON; a malformed one is backendgen's own bug (KeyError/TypeError)."""
    points = tuple(
        IntegrationPoint(
            name=p["name"],
            paths=tuple(p["paths"]),
            about=p["about"],
            replace=p["replace"],
            more_files=tuple(p.get("more_files", ())),
            provides=tuple(p.get("provides", ())),
            registers=_tuple_map(p.get("registers")),
            defines=tuple(p.get("defines", ())),
            statics=tuple(p.get("statics", ())),
            cpp_apis=_tuple_map(p.get("cpp_apis")),
            python_apis=tuple(p.get("python_apis", ())),
            python_sources=_tuple_map(p.get("python_sources")),
            optional=bool(p.get("optional", False)),
        )
        for p in data["integration_points"]
    )
    return Manifest(
        template_version=int(data["template_version"]),
        torch_minimum=data["torch"]["minimum"],
        torch_tested=tuple(data["torch"]["tested"]),
        features={n: Feature(n, int(f["since"]), f["about"]) for n, f in data["features"].items()},
        paths=dict(data["paths"]),
        build=dict(data["build"]),
        shared_files=tuple(data.get("shared_files", ())),
        integration_points=points,
        default_ops=tuple(data["default_ops"]),
        default_amp=dict(data["default_amp"]),
        device_module_provides=tuple(data.get("device_module", {}).get("provides", ())),
        device_module_not_needed=dict(data.get("device_module", {}).get("not_needed", {})),
        emulator=_emulator(data.get("emulator")),
        drivers=_drivers(data.get("drivers")),
    )


def read(template: Path) -> dict:
    """The manifest file of template directory `template` as JSON (an earlier template's too:
    backendgen.project.history reads their `template_version`)."""
    return json.loads((template / MANIFEST_FILE).read_text())


@functools.cache
def _load(template: Path) -> Manifest:
    path = template / MANIFEST_FILE
    try:
        return parse(read(template))
    except OSError as e:
        raise EnvironmentProblem(
            f"cannot read backendgen's template manifest {path}: {e.strerror}; reinstall backendgen"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise EnvironmentProblem(
            f"backendgen's template manifest {path} is broken ({type(e).__name__}: {e}); reinstall backendgen"
        ) from None


def load() -> Manifest:
    """The installed template's manifest (read once per process, when a command first needs it:
    nothing reads it at import, so a broken one fails that command with one line, not the CLI)."""
    return _load(template_dir())
