"""Builds the {{ cookiecutter.package }}._C extension with torch.utils.cpp_extension and ninja.

Build it with `pip install --no-build-isolation -e .` (an isolated build would fetch another torch),
later rebuilds with `python setup.py build_ext --inplace` or `backendgen build`.

Why the sources are grouped: every translation unit that includes torch's headers pays for parsing
them (2-7 s for narrow ATen/c10 headers, up to 35 s for <torch/extension.h>). Each integration
point keeps its own readable file, but the build compiles a few "unity" files that #include the
real ones, grouped by header weight: runtime (c10 only), profiler (the runtime's
csrc/runtime/profiler.cpp: torch's profiler and Kineto's headers), aten (dispatcher, fallback,
autocast, serialization, and csrc/distributed: host views for the collective backend), ops (the
add-op kernels and the backend's own operators, csrc/custom_ops: ATen/core headers only),
autograd (the torch::autograd::Functions add-op --autograd writes: ~12 s of autograd headers, paid
only by a project that has one), registration (the generated m.def/m.impl lines: torch/library.h)
and python (the CPython API only).
The ops group is cut into SHARDS unity files (ops-0.cpp, ...), each kernel's file in the one its
path hashes to, so editing a kernel, or the kernel an add-op writes, recompiles only its shard: a
kernel costs the compiler a fraction of a second, loading the precompiled header about one, and a
single ops unit grew with every kernel added. That, and -g0, turns a minutes-long build into tens
of seconds on two cores. Set {{ cookiecutter.DEVICE }}_UNITY_BUILD=0 to compile every file on its own
(compiler errors still name the real file either way).
The driver's files (csrc/driver: driver.h's implementation, no torch headers, a second or two
each) are never put in a unity file: each is a translation unit of its own (SEPARATE below), so a
driver written on an SDK, with the SDK's headers, macros and its own file-level statics, never
shares a unit with the runtime or with another driver file.

Precompiled headers (GCC's): the two headers whose parsing an edit pays again, torch/library.h
(the registration units) and aten/kernel_support.h (the kernels'), are each compiled once into
build/pch/<header>.gch (100-250 MB each), which comes first on the include path; a unit whose first
#include is one of them loads it instead of parsing the header: an add-op's registration unit
takes a third of its time, a kernel compiled on its own a third, the ops unit two thirds. ninja
rebuilds a .gch when a header it read changes, and the units that used it after it
(PRECOMPILED below). Set {{ cookiecutter.DEVICE }}_PRECOMPILED_HEADERS=0 to parse them in every unit (and with a
compiler other than GCC, which would not read them, none are made).

Your SDK (docs/porting.md, "SDK paths"): a driver on a vendor SDK needs its headers and libraries.
{{ cookiecutter.DEVICE }}_SDK_INCLUDE_DIRS and {{ cookiecutter.DEVICE }}_SDK_LIBRARY_DIRS (directories, separated by
os.pathsep: ':' on Linux) and {{ cookiecutter.DEVICE }}_SDK_LIBRARIES (names as -l takes them, separated by
commas or spaces: "mysdk,mysdk_rt") add them to the extension; the library directories are also
_C's run-time search path, so the package loads without LD_LIBRARY_PATH. Or the same in a file
sdk.cfg beside this one (relative paths are from this directory; several directories one a line
or separated by os.pathsep):

    [sdk]
    include_dirs = /opt/mysdk/include
    library_dirs = /opt/mysdk/lib
    libraries = mysdk mysdk_rt

A variable that is set (even empty) wins over the file's line. `backendgen build` rebuilds
through this file when either changes.

Why torch is imported late: pip runs this file twice (once for the package metadata, once to
build), and `import torch` costs seconds. Only the build_ext command needs torch, so it is
imported when that command is looked up (TorchDistribution below).

Why the package requires exactly the torch it was built with: PyTorch keeps no C++ ABI between
releases, so _C loads only beside the torch it was compiled against. The metadata therefore says
`torch==X.Y.Z`, read from the torch installed when this file runs (its version without the local
label: `2.13.0+cpu` is pinned as `torch==2.13.0`, which pip matches against 2.13.0+cpu as installed
and can resolve from an index, where no `+cpu` exists). A source or editable build in an
environment with torch installed is therefore always satisfied, and a wheel makes pip install its
torch or refuse. The build also writes `_build_info.py` (the torch it was compiled against) beside
_C; `_torch_match.py` compares it with the torch it is imported beside before loading _C.
{{ cookiecutter.DEVICE }}_TORCH_LABEL=1 appends `+torchX.Y.Z` to the version (a local label: for a
find-links directory, a release page or a private index where wheels for several torches sit side
by side; PyPI refuses local labels, so a PyPI release leaves it off).
"""

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

from setuptools import Command, Distribution, Extension, setup

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # never load a stale copy of ourselves

VERSION = "0.1.0"  # the backend's own release
TORCH_MINIMUM = "{{ cookiecutter._manifest.torch.minimum }}"  # without torch installed (an isolated build): no pin
ROOT = Path(__file__).parent.resolve()
CSRC = ROOT / "csrc"
# A group lists folders (their *.cpp files) or single files; a file a group names is not also
# compiled with its folder's group.
GROUPS = {
    "runtime": ["runtime"],
    "profiler": ["runtime/profiler.cpp"],
    "aten": ["aten", "distributed"],
    "distributed": ["distributed/process_group.cpp"],
    "ops": ["aten/ops", "custom_ops"],
    "autograd": ["autograd"],
    "registration": ["aten/ops/generated"],
    "python": ["python"],
    "driver": ["driver"],
}
# Groups whose files are compiled one by one, never in a unity file: the driver's (see the top of
# this file; last in GROUPS: the cheapest units fill the cores at the end of a build), and the
# generated registration's, which backendgen cuts by how often they change: an add-op rewrites
# registration_added.cpp and fallback_names.cpp (no header at all), not registration.cpp.
SEPARATE = {"driver", "registration"}
# Groups cut into several unity files, `<group>-<i>.cpp`: a file goes to the shard its path under
# csrc/ hashes to (crc32), so adding or editing one rewrites and recompiles only that shard. Every
# shard is written, empty or not: the list of sources stays the same when a kernel is added, and
# ninja's build file with it.
SHARDS = {"ops": 4}
# The headers precompiled (see the top of this file), as units #include them, and the group whose
# units load it. Only a unit's own first #include can load one, so that group's unity file includes
# its first file's first header itself; its units depend on the .gch even before they include it
# (registration_added.cpp has no #include until the first add-op). Any other unit that includes one
# first loads it too, and depends on it; not the aten unit, which includes kernel_support.h second
# (the long pole of a first build, it would wait for the .gch). PCH_DIR is first on the include
# path, and holds each .gch beside a link to its header (GCC finds the header there too when a
# later #include names it again).
PRECOMPILED = {"torch/library.h": "registration", "aten/kernel_support.h": "ops"}
PCH_DIR = ROOT / "build" / "pch"
EXTENSION = dict(
    name="{{ cookiecutter.package }}._C",
    include_dirs=[str(PCH_DIR), str(CSRC)],
    extra_compile_args={"cxx": ["-O2", "-g0", "-fvisibility=hidden"]},
    extra_link_args=["-Wl,-s"],
)
# The SDK a driver is built on (see the top of this file): sdk.cfg's keys and their variables.
SDK_FILE = ROOT / "sdk.cfg"
SDK_VARIABLES = {
    "include_dirs": "{{ cookiecutter.DEVICE }}_SDK_INCLUDE_DIRS",
    "library_dirs": "{{ cookiecutter.DEVICE }}_SDK_LIBRARY_DIRS",
    "libraries": "{{ cookiecutter.DEVICE }}_SDK_LIBRARIES",
}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _torch_release() -> str | None:
    """The installed torch's version without its local label (`2.13.0+cpu` -> `2.13.0`), read from
    its metadata (importing torch costs seconds), or None without torch."""
    try:
        return importlib.metadata.version("torch").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_requirement() -> str:
    release = _torch_release()
    return f"torch=={release}" if release else f"torch>={TORCH_MINIMUM}"


def version() -> str:
    release = _torch_release()
    if os.environ.get("{{ cookiecutter.DEVICE }}_TORCH_LABEL") == "1" and release:
        return f"{VERSION}+torch{release}"
    return VERSION


BUILD_INFO = '''"""Written by setup.py when it compiled _C: the torch it was compiled against."""

TORCH_VERSION = {!r}
'''


def _group_files() -> dict[str, list[Path]]:
    named = {CSRC / e for entries in GROUPS.values() for e in entries if e.endswith(".cpp")}

    def expand(entry: str) -> list[Path]:
        path = CSRC / entry
        if entry.endswith(".cpp"):
            return [path] if path.is_file() else []
        return [p for p in path.glob("*.cpp") if p not in named]

    return {g: sorted(p for e in entries for p in expand(e)) for g, entries in GROUPS.items()}


def _units(group: str, paths: list[Path]) -> dict[Path, list[Path]]:
    """The unity files of `group` (build/unity/<group>.cpp, or its SHARDS) and the files each includes."""
    unity = ROOT / "build" / "unity"
    if group not in SHARDS:
        return {unity / f"{group}.cpp": paths}
    shards = {unity / f"{group}-{i}.cpp": [] for i in range(SHARDS[group])}
    names = list(shards)
    for p in paths:
        shards[names[zlib.crc32(p.relative_to(CSRC).as_posix().encode()) % len(names)]].append(p)
    return shards


def sources() -> list[str]:
    files = _group_files()
    if os.environ.get("{{ cookiecutter.DEVICE }}_UNITY_BUILD", "1") == "0":
        return [str(p.relative_to(ROOT)) for group in files.values() for p in group]
    out = []
    for group, paths in files.items():
        if not paths or group in SEPARATE:
            for unity in _units(group, []):
                unity.unlink(missing_ok=True)
            out += [str(p.relative_to(ROOT)) for p in paths]  # each file its own unit
            continue
        for unity, included in _units(group, paths).items():
            what = "one translation unit for csrc/" + ", csrc/".join(GROUPS[group])
            if group in SHARDS:
                what += f" (shard {unity.stem.rsplit('-', 1)[1]} of {SHARDS[group]}: the files whose path hashes to it)"
            text = f"// generated by setup.py: {what}\n"
            first = _first_include(included[0]) if included else None
            if PRECOMPILED.get(first) == group:  # the file's own #include then finds it included
                text += f'#include "{first}"  // precompiled (build/pch), as {included[0].name} includes it first\n'
            # relative paths: the unit's text, and so ccache's key, is the same wherever the project is
            text += "".join(f'#include "{os.path.relpath(p, unity.parent)}"\n' for p in included)
            _write_if_changed(unity, text)
            out.append(str(unity.relative_to(ROOT)))
    return out


def _first_include(path: Path) -> str | None:
    """The header a C++ file #includes before anything else but comments and blank lines, or None."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        line = line.strip()
        if line and not line.startswith("//"):
            m = re.match(r'#\s*include\s*["<]([^">]+)[">]', line)
            return m.group(1) if m else None
    return None


def _is_gcc(cxx: str) -> bool:
    try:
        out = subprocess.run(
            [*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, ValueError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


def precompile_headers(build_ninja: Path) -> None:
    """Add PRECOMPILED to the ninja file torch has just written (see the top of this file): a rule that
    compiles a header with the units' own flags, an edge for each header into PCH_DIR, and each unit
    that loads one (its group's, or one whose first #include it is) depending on its .gch: GCC's
    dependency file of a unit that loaded a .gch does not name it. Disabled, or without GCC, PCH_DIR
    is emptied instead: no unit may read the .gch of an earlier build."""
    text = build_ninja.read_text()
    cxx = re.search(r"^cxx = (.+)$", text, re.MULTILINE)
    cflags = re.search(r"^cflags = (.+)$", text, re.MULTILINE)
    wanted = os.environ.get("{{ cookiecutter.DEVICE }}_PRECOMPILED_HEADERS", "1") != "0"
    if not (wanted and cxx and cflags and "\nrule compile\n" in text and _is_gcc(cxx.group(1))):
        shutil.rmtree(PCH_DIR, ignore_errors=True)
        return
    dirs = [Path(a[2:]) for a in shlex.split(cflags.group(1)) if a.startswith("-I") and Path(a[2:]) != PCH_DIR]
    gch = {}
    for name in PRECOMPILED:
        header = next((d / name for d in dirs if (d / name).is_file()), None)
        if header is None:
            continue
        link = PCH_DIR / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not (link.is_symlink() and os.readlink(link) == str(header)):
            link.unlink(missing_ok=True)
            link.symlink_to(header)
        gch[name] = (header, Path(f"{link}.gch"))

    group_of = {str(unity): g for g, paths in _group_files().items() for unity in _units(g, paths)}
    group_of.update((str(p), g) for g, paths in _group_files().items() for p in paths)

    def unit(m: re.Match) -> str:
        first, group = _first_include(Path(m.group(2))), group_of.get(str(Path(m.group(2)).resolve()))
        loads = [out for name, (_, out) in gch.items() if name == first or PRECOMPILED[name] == group]
        return m.group(0) + (f" | {' '.join(map(str, loads))}" if loads else "")

    text = re.sub(r"^build (\S+): compile (\S+)$", unit, text, flags=re.MULTILINE)
    text += "\nrule precompile\n  command = $cxx -MMD -MF $out.d $cflags -x c++-header $in -o $out $post_cflags\n"
    text += "  depfile = $out.d\n  deps = gcc\n\n"
    text += "".join(f"build {out}: precompile {header}\n" for header, out in gch.values())
    build_ninja.write_text(text)


def _sdk_paths(text: str, base: Path) -> list[str]:
    parts = (p.strip() for line in text.splitlines() for p in line.split(os.pathsep))
    return [str(base / Path(p).expanduser()) for p in parts if p]


def sdk() -> dict[str, list[str]]:
    """The SDK's include_dirs, library_dirs and libraries: each from its variable when set, else
    from sdk.cfg's [sdk] section, else none (see the top of this file)."""
    import configparser

    config = configparser.ConfigParser(interpolation=None)
    try:
        config.read_string(SDK_FILE.read_text(), source=str(SDK_FILE))
    except FileNotFoundError:
        pass
    except configparser.Error as e:
        sys.exit(f"{SDK_FILE}: {e}")
    section = config["sdk"] if config.has_section("sdk") else {}
    unknown = sorted(set(section) - set(SDK_VARIABLES))
    if unknown:
        sys.exit(f"{SDK_FILE}: [sdk] has {', '.join(unknown)}; it takes {', '.join(SDK_VARIABLES)}")
    out = {}
    for key, variable in SDK_VARIABLES.items():
        text, base = (os.environ[variable], Path.cwd()) if variable in os.environ else (section.get(key, ""), ROOT)
        out[key] = text.replace(",", " ").split() if key == "libraries" else _sdk_paths(text, base)
    return out


def extension(extra_include_dirs: list[str]) -> dict:
    """The extension's arguments: EXTENSION, the SDK's paths (the library directories also as
    _C's run-time search path), then `extra_include_dirs`."""
    paths = sdk()
    return dict(
        EXTENSION,
        include_dirs=EXTENSION["include_dirs"] + paths["include_dirs"] + extra_include_dirs,
        library_dirs=paths["library_dirs"],
        runtime_library_dirs=paths["library_dirs"],
        libraries=paths["libraries"],
    )


def torch_build_ext():
    """torch.utils.cpp_extension's BuildExtension (with ninja), building the CppExtension."""
    from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

    class BuildExt(BuildExtension):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, use_ninja=True, **kwargs)

        def finalize_options(self):
            # CppExtension adds torch's include and library paths to the extension; Kineto's
            # headers (the profiler's) include each other by bare name, from their own folder
            kineto = [str(Path(p) / "kineto") for p in include_paths() if (Path(p) / "kineto").is_dir()]
            self.distribution.ext_modules = [CppExtension(sources=sources(), **extension(kineto))]
            super().finalize_options()
            # ninja's files and the objects stay in the project's build/ (setuptools' usual place)
            # even when pip builds (it picks a temporary directory, deleted afterwards): the next
            # build, whether pip, setup.py or backendgen, then recompiles only what changed
            self.build_temp = str(ROOT / "build" / f"temp.{self.plat_name}-{sys.implementation.cache_tag}")

        def build_extensions(self):
            # torch writes ninja's build file and runs ninja in one call: the precompiled headers
            # join the file in between (precompile_headers)
            from torch.utils import cpp_extension

            write = getattr(cpp_extension, "_write_ninja_file", None)
            written = []
            if write is None:  # a torch that builds otherwise: no unit may read a stale .gch
                shutil.rmtree(PCH_DIR, ignore_errors=True)
                return super().build_extensions()

            def write_and_precompile(*args, **kwargs):
                write(*args, **kwargs)
                written.append(Path(kwargs["path"] if "path" in kwargs else args[0]))
                precompile_headers(written[-1])

            cpp_extension._write_ninja_file = write_and_precompile
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file = write
                if not written:  # a torch that builds otherwise: no later unit may read a stale .gch
                    shutil.rmtree(PCH_DIR, ignore_errors=True)

        def run(self):
            super().run()
            # beside _C (the package in place, or the wheel's build/lib): the torch it was built for
            import torch

            info = Path(self.get_ext_fullpath(EXTENSION["name"])).parent / "_build_info.py"
            _write_if_changed(info, BUILD_INFO.format(torch.__version__))

    return BuildExt


class WriteUnits(Command):
    """`python setup.py -q unity`: write the unity files and print the sources a build compiles,
    without compiling or importing torch. `backendgen build` runs it after a source file was added
    or removed, to learn whether ninja's existing build file still covers the project."""

    description = "write build/unity/*.cpp and print the list of sources"
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        print("sources:", json.dumps(sources()))


class TorchDistribution(Distribution):
    """Imports torch only for a command that compiles (see the top of this file). pip's metadata
    step (dist_info, egg_info) also looks up build_ext, but only to list source files: it gets
    setuptools' own build_ext."""

    METADATA_COMMANDS = {"egg_info", "dist_info"}

    def get_command_class(self, command):
        compiling = not set(self.commands) <= self.METADATA_COMMANDS
        if command == "build_ext" and command not in self.cmdclass and compiling:
            self.cmdclass[command] = torch_build_ext()
        return super().get_command_class(command)


setup(
    version=version(),
    install_requires=[torch_requirement()],
    # a placeholder until build_ext replaces it with the CppExtension (it only tells setuptools
    # that this package has a compiled extension)
    ext_modules=[Extension(EXTENSION["name"], sources=[])],
    distclass=TorchDistribution,
    cmdclass={"unity": WriteUnits},
)
