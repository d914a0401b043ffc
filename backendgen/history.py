"""Every earlier template version, kept in the package so `backendgen update` can re-render it.

`update` merges what changed between the template a project was generated from and the current
one into the project (backendgen/update.py); for that it renders the older template with the
project's own answers. Users install a wheel, without this repository's git history, so each
earlier version is stored here as a compressed tarball of the repository's `template/` directory
at the last commit of that version: `backendgen/template_history/<N>.tar.gz`. The current version
renders from the template itself (backendgen.manifest.template_dir).

Whoever bumps the template to N+1 first snapshots N (tests/test_update.py fails until they do):

    python -m backendgen.history --snapshot N COMMIT    # COMMIT: the last commit of template N
    python -m backendgen.history --check                # which versions are missing
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from backendgen import manifest
from backendgen.errors import UserError

HISTORY_DIR = Path(__file__).resolve().parent / "template_history"
_PREFIX = "template/"


def current_version() -> int:
    return manifest.load().template_version


def snapshot_path(version: int) -> Path:
    return HISTORY_DIR / f"{version}.tar.gz"


def stored_versions() -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in HISTORY_DIR.glob("*.tar.gz") if p.name.split(".")[0].isdigit())


def missing_versions() -> list[int]:
    """Versions below the current one without a snapshot: update cannot start from them."""
    have = set(stored_versions())
    return [v for v in range(1, current_version()) if v not in have]


@contextlib.contextmanager
def template_of(version: int):
    """The template directory (with `cookiecutter.json`, `template.json`, `ops/`) of `version`:
    the installed template for the current version, an extracted snapshot for an earlier one
    (removed when the block ends)."""
    current = current_version()
    if version == current:
        yield manifest.template_dir()
        return
    if version > current:
        raise UserError(f"template {version} is newer than this backendgen's template {current}; upgrade backendgen")
    path = snapshot_path(version)
    if version < 1 or not path.is_file():
        raise UserError(f"this backendgen has no copy of template {version} (backendgen/template_history); "
                        "reinstall backendgen")
    with tempfile.TemporaryDirectory(prefix=f"backendgen-template{version}-") as tmp:
        with tarfile.open(path, "r:gz") as tar:
            _extract(tar, Path(tmp))
        root = Path(tmp) / "template"
        if not (root / "cookiecutter.json").is_file():
            raise UserError(f"{path} is not a template snapshot; reinstall backendgen")
        yield root


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    for member in tar.getmembers():
        name = member.name
        if not name.startswith(_PREFIX) or ".." in Path(name).parts or not (member.isfile() or member.isdir()):
            raise UserError(f"unexpected entry {name!r} in a template snapshot; reinstall backendgen")
    if sys.version_info >= (3, 12):
        tar.extractall(dest, filter="data")
    else:  # pragma: no cover - the names were checked above
        tar.extractall(dest)


def snapshot(version: int, commit: str, *, repo: Path | None = None) -> Path:
    """Store `template/` at `commit` of the repository `repo` as template `version`'s snapshot.

    The tarball is deterministic (sorted names, no times or owners), so re-running it for the same
    commit changes nothing in git."""
    repo = Path(repo or Path(__file__).resolve().parent.parent)
    try:
        data = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, "template"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr.decode(errors="replace").strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        raise UserError(f"git archive {commit} template failed: {detail}") from None
    files: dict[str, tuple[bytes, int]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as src:
        for member in src.getmembers():
            if member.isfile():
                files[member.name] = (src.extractfile(member).read(), member.mode & 0o111)
    recorded_manifest = files.get(f"template/{manifest.MANIFEST_FILE}")
    if recorded_manifest is None:
        raise UserError(f"{commit} has no template/{manifest.MANIFEST_FILE}")
    recorded = int(json.loads(recorded_manifest[0])["template_version"])
    if recorded != version:
        raise UserError(f"template/template.json at {commit} says template {recorded}, not {version}")
    HISTORY_DIR.mkdir(exist_ok=True)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            content, executable = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), 0o644 | (executable and 0o111), 0
            tar.addfile(info, io.BytesIO(content))
    path = snapshot_path(version)
    path.write_bytes(out.getvalue())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backendgen.history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", nargs=2, metavar=("VERSION", "COMMIT"),
                        help="store template/ at COMMIT as template VERSION")
    parser.add_argument("--check", action="store_true", help="exit 1 if a version below the current one has no snapshot")
    args = parser.parse_args(argv)
    if args.snapshot:
        version, commit = args.snapshot
        try:
            path = snapshot(int(version), commit)
        except (UserError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    if args.check or not args.snapshot:
        missing = missing_versions()
        if missing:
            print(f"no snapshot of template {', '.join(map(str, missing))}: run python -m backendgen.history "
                  f"--snapshot N COMMIT (COMMIT: the last commit of template N)", file=sys.stderr)
            return 1
        print(f"templates 1..{current_version() - 1} are stored; {current_version()} is template/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
