"""Every state every earlier template version had, kept in the package so `backendgen update` can
re-render the exact template a project was generated from.

`update` merges what changed between the template a project was generated from and the current
one into the project (backendgen/commands/update.py); for that it renders the older template with the
project's own answers (backendgen/project/template_states.py). The template changed many times under
one version number, so a version is not one template: each distinct state of the repository's
`template/` directory (one per commit that changed it, identical trees once) is stored, named by its
state hash (backendgen.project.template_tree: the hash `new` and `update` record as `template_state`).

Users install a wheel without this repository's git history, so the states are in the package,
content-addressed: `backendgen/template_history/states.tar.xz` holds `index.json` (each state: its
hash, version, commit, git tree and {path: blob}) and `blobs/<sha256>`, each distinct file content
once (xz compresses the versions of one file, stored side by side, against each other). The current
version renders from the installed template itself (backendgen.project.manifest.template_dir).

Whoever commits a change to the template stores the states before it (tests/test_update.py fails
until they do: run it before a landing); the command re-derives the whole store from git history,
deterministically, leaving out only HEAD's state, which is the installed template:

    python -m backendgen.project.history --snapshot    # every state of every version but HEAD's
    python -m backendgen.project.history --check       # which versions are missing
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import lzma
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backendgen.plumbing import git
from backendgen.plumbing.errors import UserError
from backendgen.project import manifest, template_tree

HISTORY_DIR = Path(__file__).resolve().parent.parent / "template_history"
STORE = HISTORY_DIR / "states.tar.xz"
_PREFIX = "template/"


@dataclass(frozen=True)
class State:
    """One stored state of an earlier template."""

    hash: str  # backendgen.project.template_tree.state_hash of its files
    version: int
    commit: str  # the first commit whose template/ was this tree
    tree: str  # git's id of that tree
    order: int  # 0 = the state that stopped being current first; the last of a version is its release
    files: tuple[tuple[str, str], ...]  # (path, sha256 of the bytes), sorted
    executable: frozenset[str] = frozenset()

    def describe(self) -> str:
        return f"template {self.version} as of {self.commit[:10]}"


def current_version() -> int:
    return manifest.load().template_version


@functools.cache
def paths_of(version: int) -> dict[str, str]:
    """Where things live in a project of template `version`: the "paths" of that version's manifest
    (its last stored state's template.json; the installed one for the current version). A key an older
    manifest lacks (templates before 8 had no "paths"; "model_tests" came in 9) names where the current
    template puts it (such a project has no such file; callers look before they use it)."""
    current = manifest.load()
    if version == current.template_version:
        return dict(current.paths)
    stored = states(version)
    digest = dict(stored[-1].files).get(manifest.MANIFEST_FILE) if stored else None
    old = {}
    if digest is not None:
        try:
            old = json.loads(blob(digest)).get("paths") or {}
        except (ValueError, AttributeError) as e:
            raise UserError(
                f"{STORE}'s manifest of template {version} is damaged ({e}); reinstall backendgen"
            ) from None
    return {**current.paths, **old}


def manifest_of(state: State) -> dict:
    """The parsed template.json of a stored state ({} for one without)."""
    digest = dict(state.files).get(manifest.MANIFEST_FILE)
    if digest is None:
        return {}
    try:
        data = json.loads(blob(digest))
    except ValueError as e:
        raise UserError(f"{STORE}'s manifest of {state.describe()} is damaged ({e}); reinstall backendgen") from None
    return data if isinstance(data, dict) else {}


@functools.cache
def current_state() -> str:
    """The state hash of the installed template (the same for an editable and a wheel install)."""
    return template_tree.state_hash(manifest.template_dir())


@functools.lru_cache(maxsize=1)
def _store() -> tuple[tuple[State, ...], dict[str, bytes]]:
    if not STORE.is_file():
        return (), {}
    try:
        with tarfile.open(STORE, "r:xz") as tar:
            index, blobs = None, {}
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                data = tar.extractfile(member).read()
                if member.name == "index.json":
                    index = json.loads(data)
                elif member.name.startswith("blobs/"):
                    blobs[member.name[len("blobs/") :]] = data
        if index is None:
            raise ValueError("no index.json")
        hashes = index["blobs"]
        states = tuple(
            State(
                hash=s["state"],
                version=int(s["version"]),
                commit=s["commit"],
                tree=s["tree"],
                order=i,
                files=tuple((path, hashes[blob]) for path, blob in s["files"]),
                executable=frozenset(s.get("executable", ())),
            )
            for i, s in enumerate(index["states"])
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError, tarfile.TarError, lzma.LZMAError) as e:
        raise UserError(f"{STORE} is damaged ({e}); reinstall backendgen") from None
    return states, blobs


def states(version: int | None = None) -> list[State]:
    """The stored states (of `version`), oldest first."""
    return [s for s in _store()[0] if version is None or s.version == version]


def blob(digest: str) -> bytes:
    """A stored file's bytes, by the SHA-256 the states name it by."""
    return _store()[1][digest]


def find(state_hash: str) -> State | None:
    return next((s for s in _store()[0] if s.hash == state_hash), None)


def stored_versions() -> list[int]:
    return sorted({s.version for s in states()})


def missing_versions() -> list[int]:
    """Versions below the current one without a stored state: update cannot start from them."""
    have = set(stored_versions())
    return [v for v in range(1, current_version()) if v not in have]


@contextlib.contextmanager
def materialized(state: State):
    """The template directory of a stored state (removed when the block ends)."""
    blobs = _store()[1]
    with tempfile.TemporaryDirectory(prefix=f"backendgen-template{state.version}-") as tmp:
        root = Path(tmp) / "template"
        for rel, digest in state.files:
            if ".." in rel.split("/") or rel.startswith("/"):
                raise UserError(f"unexpected path {rel!r} in {STORE}; reinstall backendgen")
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blobs[digest])
            if rel in state.executable:
                path.chmod(0o755)
        if not (root / "cookiecutter.json").is_file():
            raise UserError(f"{state.describe()} in {STORE} is not a template; reinstall backendgen")
        yield root


@contextlib.contextmanager
def template_of(version: int):
    """The template directory (with `cookiecutter.json`, `template.json`, `ops/`) of `version`:
    the installed template for the current version, the last stored state of an earlier one."""
    current = current_version()
    if version == current:
        yield manifest.template_dir()
        return
    if version > current:
        raise UserError(f"template {version} is newer than this backendgen's template {current}; upgrade backendgen")
    found = states(version)
    if version < 1 or not found:
        raise UserError(
            f"this backendgen has no copy of template {version} (backendgen/template_history); reinstall backendgen"
        )
    with materialized(found[-1]) as root:
        yield root


# --- the maintainer's command: the store, from git history -----------------------------------------


def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    try:
        proc = git.run(*args, cwd=repo, data=data)
    except OSError as e:
        raise UserError(f"git {' '.join(args[:2])} failed: {e}") from None
    if proc.returncode != 0:
        raise UserError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def git_states(repo: Path, current: int) -> list[dict]:
    """Every distinct state of `template/` in the history of HEAD whose template.json says a version
    up to `current`, except HEAD's own (the installed template), in the order they were last
    current: {"commit", "tree", "version", "files": {path: git blob id}, "x": paths}. Earlier states
    of the current version are there so that a project from one of them updates like one from an
    earlier version (a template can change without its version changing)."""
    commits = _git(repo, "rev-list", "--reverse", "--topo-order", "HEAD", "--", "template").decode().split()
    trees = _git(repo, "rev-parse", *(f"{c}:template" for c in commits)).decode().split()
    head = _git(repo, "rev-parse", "HEAD:template").decode().strip()
    first: dict[str, str] = {}
    last: dict[str, int] = {}
    for i, (commit, tree) in enumerate(zip(commits, trees, strict=True)):
        first.setdefault(tree, commit)
        last[tree] = i
    found = []
    # ordered by when each state was last current (a tree a later commit went back to counts then)
    for tree in sorted(last, key=last.get):
        if tree == head:
            continue
        commit = first[tree]
        listing = _git(repo, "ls-tree", "-r", "-z", tree).decode()
        files, executable = {}, []
        for entry in filter(None, listing.split("\0")):
            meta, path = entry.split("\t", 1)
            mode, kind, blob = meta.split()
            if kind == "blob" and not template_tree.is_ignored(path):
                files[path] = blob
                if mode == "100755":
                    executable.append(path)
        if "cookiecutter.json" not in files or manifest.MANIFEST_FILE not in files:
            continue  # the first commits: no template a backendgen could render yet
        recorded = json.loads(_git(repo, "cat-file", "blob", files[manifest.MANIFEST_FILE]))
        version = int(recorded.get("template_version", 1))
        if version <= current:
            found.append({"commit": commit, "tree": tree, "version": version, "files": files, "x": executable})
    return found


def snapshot(*, repo: Path | None = None) -> Path:
    """Store every state of every template version, from `repo`'s history, but the one HEAD has.
    Deterministic: re-running it on the same history changes no byte."""
    repo = Path(repo or Path(__file__).resolve().parent.parent.parent)
    found = git_states(repo, current_version())
    if not found:
        raise UserError(f"no earlier template state in the git history of {repo}")
    contents: dict[str, bytes] = {}  # git blob id -> bytes
    wanted = sorted({blob for s in found for blob in s["files"].values()})
    batch = _git(repo, "cat-file", "--batch", data="".join(f"{b}\n" for b in wanted).encode())
    at = 0
    for blob in wanted:
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        contents[blob] = batch[header_end + 1 : header_end + 1 + size]
        at = header_end + 1 + size + 1
    digests = {blob: template_tree.blob_hash(data) for blob, data in contents.items()}
    # blobs in the order of their path's first appearance, then age: versions of one file side by side
    order: dict[str, tuple[str, int]] = {}
    for i, s in enumerate(found):
        for path, blob in s["files"].items():
            order.setdefault(digests[blob], (path, i))
    blob_list = sorted(order, key=lambda d: order[d])
    blob_index = {d: i for i, d in enumerate(blob_list)}
    index = {"format": 1, "blobs": blob_list, "states": []}
    for s in found:
        hashes = {path: digests[blob] for path, blob in s["files"].items()}
        entry = {
            "state": template_tree.state_hash_of(hashes),
            "version": s["version"],
            "commit": s["commit"],
            "tree": s["tree"],
            "files": [[p, blob_index[hashes[p]]] for p in sorted(hashes)],
        }
        if s["x"]:
            entry["executable"] = sorted(s["x"])
        index["states"].append(entry)
    by_digest = {digests[blob]: data for blob, data in contents.items()}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("index.json", json.dumps(index, separators=(",", ":"), sort_keys=True).encode())
        for digest in blob_list:
            add(f"blobs/{digest}", by_digest[digest])
    HISTORY_DIR.mkdir(exist_ok=True)
    STORE.write_bytes(lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    _store.cache_clear()
    return STORE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backendgen.project.history", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="store every state of every template version but HEAD's, from git history",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a version below the current one has no state")
    args = parser.parse_args(argv)
    if args.snapshot:
        try:
            path = snapshot()
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(states())} states)")
    missing = missing_versions()
    if missing:
        print(
            f"no state of template {', '.join(map(str, missing))}: run python -m backendgen.project.history --snapshot "
            f"before bumping the template version",
            file=sys.stderr,
        )
        return 1
    counts = ", ".join(f"{v}: {len(states(v))}" for v in stored_versions())
    print(
        f"templates 1..{current_version() - 1} are stored (states per version: {counts}); "
        f"{current_version()} is the installed template"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
