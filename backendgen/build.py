"""Building a generated project and running its tests.

The first build is `pip install --no-build-isolation --no-deps -e .` (a build-isolated env would
fetch another torch); later builds run `setup.py build_ext --inplace`, which lets ninja recompile
only what changed. Compilers go through ccache when it is installed. Output goes to a log file
under `build/`; a failure is reported with its first compiler error and the log's path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from backendgen.errors import BuildError, EnvironmentProblem, TestFailure

LOG_DIR = "build"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # a stale build must not load into the build itself
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    masq = ccache_dir()
    if masq is not None:
        env["PATH"] = f"{masq}{os.pathsep}{env.get('PATH', '')}"
    elif os.environ.get("BACKENDGEN_NO_CCACHE"):
        env["TORCH_NO_COMPILER_WRAPPER"] = "1"  # torch's cpp_extension prepends a ccache it finds on PATH itself
    env.update(extra or {})
    return env


def _find_ccache() -> str | None:
    found = shutil.which("ccache")
    if found:
        return found
    candidate = Path(sys.executable).parent / "ccache"
    return str(candidate) if candidate.is_file() else None


def ccache_dir() -> Path | None:
    """A directory of compiler names linked to ccache (its masquerade mode), or None without ccache."""
    if os.environ.get("BACKENDGEN_NO_CCACHE"):
        return None
    ccache = _find_ccache()
    if ccache is None:
        return None
    from backendgen.opdb import cache_dir

    d = cache_dir() / "ccache-bin"
    try:
        d.mkdir(parents=True, exist_ok=True)
        for name in ("c++", "g++", "cc", "gcc"):
            link = d / name
            if not link.exists():
                link.symlink_to(ccache)
    except OSError:
        return None
    return d


def check_toolchain() -> None:
    """Fail early, with what to install, when the build cannot work."""
    cxx = os.environ.get("CXX", "c++")
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
        raise EnvironmentProblem("wheel is not installed (needed by pip install --no-build-isolation); pip install wheel")


_ERROR = re.compile(r"(error:|Error:|undefined reference|fatal error)")


def first_error(text: str) -> str | None:
    for line in text.splitlines():
        if _ERROR.search(line) and "warning:" not in line:
            return line.strip()[:400]
    return None


def _run(cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc


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


def build(root: Path, package: str, dist_name: str, *, incremental: bool = True) -> Path:
    """Build the project's extension in place; return the log path."""
    check_toolchain()
    log = root / LOG_DIR / "backendgen-build.log"
    if incremental and extension_path(root, package) is not None and installed_from(root, dist_name):
        cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
    else:
        check_installable()
        cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", str(root)]
    proc = _run(cmd, root, log, _env())
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        raise BuildError("build failed", log=log, first_error=first_error(text))
    return log


def installed_from(root: Path, dist_name: str) -> bool:
    """Whether an editable install of the project at `root` is what this Python imports."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    try:
        dist = importlib.metadata.distribution(dist_name)
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    url = urlparse(info.get("url", ""))
    if url.scheme != "file" or not info.get("dir_info", {}).get("editable"):
        return False
    return Path(unquote(url.path)).resolve() == root.resolve()


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")


def run_tests(root: Path, paths: list[str] | None = None, *, name: str = "test") -> Path:
    """Run the project's pytest suite (or `paths` in it); raise TestFailure naming failed tests."""
    log = root / LOG_DIR / f"backendgen-{name}.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *(paths or ["tests"])]
    env = _env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the tests use the backend as a user would
    env.pop("PYTEST_ADDOPTS", None)
    proc = _run(cmd, root, log, env)
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        failed = [m.group(2) for m in map(_FAILED.match, text.splitlines()) if m]
        if proc.returncode == 5:
            raise TestFailure("no tests were collected", log=log)
        raise TestFailure("tests failed", failed=failed, log=log)
    return log
