"""Does the project agree with itself? Its record (backendgen.json), its files, its built library.

Every command that changes or builds a project inspects it first (`inspect`), and `check` reports
the same findings:

- a file the record names (an add-op kernel, an own operator's or an override's sources, or the
  `setup.py` every build runs) is gone: `require_files` refuses, naming it and how to restore it,
  instead of a compiler or setuptools failing somewhere later;
- the record has entries the last successful build did not see (build.BUILT, written after each
  build: `metadata.built_entries`), e.g. after add-op was killed (SIGKILL, power loss) between
  recording an operator and building it: `unbuilt` names them, and add-op of the same operator
  builds and tests it instead of answering "already native".

When no build was recorded (a project built before this file existed, or its `build/` deleted),
the library is taken to match: nothing is known to be missing from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backendgen.plumbing.errors import ProjectError
from backendgen.project.on_disk import Project
from backendgen.toolchain import build

# files a build of any generated project runs
BUILD_FILES = ("setup.py", "pyproject.toml")


@dataclass
class State:
    missing: list[str] = field(default_factory=list)  # recorded or needed files that are gone
    unbuilt: list[str] = field(default_factory=list)  # recorded entries the library was not built with
    removed: list[str] = field(default_factory=list)  # entries built in, no longer recorded (rebuild)
    built: bool = False  # the package has a library

    @property
    def stale(self) -> bool:
        return bool(self.unbuilt or self.removed)


def recorded_files(project: Project) -> list[str]:
    """The files backendgen.json says the project has (sources a build compiles, their Python parts)."""
    from backendgen.kinds.registry import KINDS

    files = [f for kind in KINDS for rec in kind.records(project) for f in kind.record_files(rec)]
    return list(dict.fromkeys(files))


def inspect(project: Project) -> State:
    root = project.root
    state = State(built=build.extension_path(root, project.package) is not None)
    state.missing = [rel for rel in (*BUILD_FILES, *recorded_files(project)) if not (root / rel).is_file()]
    seen = build.built_entries(root)
    if state.built and seen is not None:
        now = project.record.built_entries()
        state.unbuilt = [e for e in now if e not in seen]
        state.removed = [e for e in seen if e not in now]
    return state


def require_files(project: Project, state: State, *, ignore: tuple[str, ...] = ()) -> None:
    """Refuse (exit 2) when a file the project needs is gone, naming it."""
    missing = [rel for rel in state.missing if rel not in ignore]
    if not missing:
        return
    listed = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
    one = len(missing) == 1
    why = (
        ("backendgen.json records it" if one else "backendgen.json records them")
        if any(rel not in BUILD_FILES for rel in missing)
        else ("every build runs it" if one else "every build runs them")
    )
    also = (
        ", or remove its operator with backendgen remove-op" if any(rel not in BUILD_FILES for rel in missing) else ""
    )
    raise ProjectError(
        f"{listed} {'is' if one else 'are'} missing from {project.root} ({why}); restore "
        f"{'it' if one else 'them'} (e.g. git checkout -- {missing[0]}){also}"
    )


def unbuilt_records(project: Project, state: State) -> list[str]:
    """The qualified operators (kernels, own operators, overrides) recorded but not built."""
    names = []
    for entry in state.unbuilt:
        kind, _, rest = entry.partition(" ")
        if kind == "amp":
            continue
        names.append(rest if kind == "autograd" else entry)
    return names
