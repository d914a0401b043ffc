"""The processes backendgen starts for a project: their environment (the build's, with ccache and the
job count; the project's tests') and the runner that writes a command's output to a log file.
`build` (compiler, pip, pytest) and `conformance` (the project's suite) both start theirs here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from backendgen.plumbing import interrupt
from backendgen.plumbing.environment import subprocess_env


def build_env(autoload: str | None = "0", root: Path | None = None) -> dict[str, str]:
    """The environment of the build's processes (autoload off: a stale build must not load into the
    build itself), or the project's tests' (`test_env`). With the project's `root`, ccache reads
    paths inside the project as relative ones (CCACHE_BASEDIR; the template's unity files include
    their sources by relative path), so a copy or a move of a project is served from the cache."""
    env = subprocess_env(autoload=autoload)
    if root is not None:
        env.setdefault("CCACHE_BASEDIR", str(root.resolve()))
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    masq = ccache_dir()
    if masq is not None:
        env["PATH"] = f"{masq}{os.pathsep}{env.get('PATH', '')}"
        env["CCACHE_SLOPPINESS"] = _with_pch_sloppiness(env.get("CCACHE_SLOPPINESS", ""))
    elif os.environ.get("BACKENDGEN_NO_CCACHE"):
        env["TORCH_NO_COMPILER_WRAPPER"] = "1"  # torch's cpp_extension prepends a ccache it finds on PATH itself
    return env


# what ccache needs to cache the precompiled headers the template's setup.py makes (build/pch/*.gch)
# and the units that read them: without it, it compiles both every time ("could not use precompiled
# header"). The project's sources use neither __DATE__ nor __TIME__.
PCH_SLOPPINESS = ("pch_defines", "time_macros")


def _with_pch_sloppiness(value: str) -> str:
    """CCACHE_SLOPPINESS with PCH_SLOPPINESS added to what the user set."""
    have = [v for v in value.replace(" ", ",").split(",") if v]
    return ",".join(have + [v for v in PCH_SLOPPINESS if v not in have])


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
    from backendgen.torchdb.opdb import cache_dir

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


def logged(cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `cmd` in `cwd` with `env`, its output (after a `$ cmd` line) in `log`, stdin closed; the
    caller reads the return code and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        # in a process group of its own, stopped with everything under it if this command is interrupted
        proc = interrupt.run(
            cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, phase="build:child"
        )
    return proc


def test_env(autoload: str | None = None) -> dict[str, str]:
    """The environment the project's tests run in: autoload unset (they use the backend as a user
    would), or `autoload` while pytest waits for a build (build.tests_started_early)."""
    env = build_env(autoload=autoload)
    env.pop("PYTEST_ADDOPTS", None)
    return env
