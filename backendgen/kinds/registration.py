"""The generated registration files: `csrc/aten/ops/generated/registration.cpp` (Project.registration_file)
and, from template 12 on (the `registration_shards` feature), two beside it.

Together they hold the `m.impl` of every kernel add-op wrote, the CPU fallback registered by name for
the operators that need it, the backend's own operators (`m.def` and their kernels), the autograd
overrides and the autocast table. From template 12 they are cut by how often they change, each a
translation unit of its own (setup.py's SEPARATE), so an add-op recompiles two small units instead
of every m.impl: registration.cpp keeps what `backendgen new` wrote (its kernels, and the rest but
the two below), registration_added.cpp the kernels added since, and fallback_names.cpp the list of
operators registered to the CPU fallback by name (data, no header: it changes with most add-ops).

They are tool-owned: written from backendgen.json and the installed torch, each sealed on its last
line with the hash of the rest, so that a later command can tell a file it may rewrite (whatever
the metadata says, e.g. after a run killed half-way) from one edited by hand, which it refuses to
touch. A deleted file is simply written again.
"""

from __future__ import annotations

import posixpath

from backendgen.kinds import customop, jinja
from backendgen.plumbing.errors import ProjectError
from backendgen.plumbing.files import sha256_text
from backendgen.project import amp
from backendgen.project.on_disk import Project, Transaction
from backendgen.torchdb.opdb import OpDB

_SEAL = "// backendgen sha256: "
FEATURE = "registration_shards"
# The files beside the registration file from template 12 on (the FEATURE), by role.
ADDED, FALLBACK_NAMES = "registration_added.cpp", "fallback_names.cpp"


def siblings(registration_file: str) -> tuple[str, str]:
    """The paths of registration_added.cpp and fallback_names.cpp beside `registration_file`."""
    folder = posixpath.dirname(registration_file)
    return posixpath.join(folder, ADDED), posixpath.join(folder, FALLBACK_NAMES)


def _all(main: str, features) -> list[str]:
    return [main, *siblings(main)] if FEATURE in features else [main]


def paths(project: Project) -> list[str]:
    """The generated registration files of `project`, relative to its root: one before template 12."""
    return _all(project.registration_file, project.features)


def current_paths() -> list[str]:
    """The generated registration files a project of the current template has (what update writes)."""
    from backendgen.project import manifest

    tpl = manifest.load()
    return _all(tpl.path("registration"), tpl.current_features)


def _sealed(text: str) -> str:
    return f"{text}{_SEAL}{sha256_text(text)}\n"


def render(
    entries: list[dict] = (),
    *,
    device: str,
    fallbacks: list[str] = (),
    custom=(),
    overrides=(),
    amp: list[tuple[str, str]] = (),
    fallback_table: bool = False,
) -> str:
    """The registration file's text: one m.impl per generated kernel (`entries`: kernelgen.registration_entry),
    sorted by operator, the CPU fallback registered by name for `fallbacks` (kinds.aten_kernel.fallback_registrations),
    or, with `fallback_table`, for each name of fallback_names.cpp (render_fallback_names), the backend's own
    operators (`custom`: customop.CustomOp), autograd overrides (`overrides`: overrides.Override) and the
    autocast table (`amp`: (operator, policy) pairs); then the seal."""
    entries = sorted(entries, key=lambda e: e["name"])
    custom = sorted(custom, key=lambda c: c.name)
    custom_view = [
        {
            "namespace": c.cpp_namespace,
            "source": c.source,
            "schema": c.schema,
            "decls": [customop.declaration(c, fn) for fn in c.kernel_names.values()],
        }
        for c in custom
    ]
    impls = [
        (key, [(c.name, f"{c.cpp_namespace}::{c.kernel_names[key]}") for c in custom if key in c.kernel_names])
        for key in ("PrivateUse1", "CPU", "Meta", "Autograd")
    ]
    overrides_view = [
        {"name": o.op.name, "namespace": o.namespace, "source": o.source, "decl": o.declaration}
        for o in sorted(overrides, key=lambda o: o.op.name)
    ]
    text = (
        jinja.environment()
        .get_template("registration.cpp.j2")
        .render(
            device=device,
            entries=entries,
            fallbacks=sorted(fallbacks),
            custom=custom_view,
            custom_impls=[(k, v) for k, v in impls if v],
            inplace_or_view=[c.name for c in custom if c.aliases],
            mutating=[c.name for c in custom if c.mutates],
            views=[c.name for c in custom if c.aliases and not c.mutates],
            overrides=overrides_view,
            amp=list(amp),
            fallback_table=fallback_table,
        )
    )
    return _sealed(text)


def render_added(entries: list[dict] = (), *, device: str) -> str:
    """registration_added.cpp: one m.impl per kernel added after `backendgen new`, sorted by operator."""
    env = jinja.environment()
    text = env.get_template("registration_added.cpp.j2").render(
        device=device, entries=sorted(entries, key=lambda e: e["name"])
    )
    return _sealed(text)


def render_fallback_names(fallbacks: list[str] = (), *, device: str) -> str:
    """fallback_names.cpp: the names registration.cpp registers to the CPU fallback, sorted."""
    text = jinja.environment().get_template("fallback_names.cpp.j2").render(device=device, fallbacks=sorted(fallbacks))
    return _sealed(text)


def is_pristine(text: str) -> bool:
    """Whether `text` is a registration file exactly as backendgen wrote it."""
    body, sep, seal = text.rstrip("\n").rpartition("\n" + _SEAL)
    return bool(sep) and seal == sha256_text(body + "\n")


def files(project: Project, db: OpDB) -> dict[str, str]:
    """The files `project` needs with the installed torch (`db`), from its backendgen.json, by path
    relative to its root: each operator kind's lines (kinds.registry), then the autocast table. Before
    template 12, one file with all of it."""
    from backendgen.kinds.registry import KINDS

    context = {}
    for kind in KINDS:
        context.update(kind.registration(project, db))
    amp_table = [(name, policy) for name, policy in amp.entries(project.amp_table or {}) if db.get(name) is not None]
    added = context.pop("added_entries", [])
    if FEATURE not in project.features:
        return {project.registration_file: render(device=project.device, amp=amp_table, **context)}
    fallbacks = context.pop("fallbacks", [])
    added_file, names_file = siblings(project.registration_file)
    return {
        project.registration_file: render(device=project.device, amp=amp_table, fallback_table=True, **context),
        added_file: render_added(added, device=project.device),
        names_file: render_fallback_names(fallbacks, device=project.device),
    }


def needs_rewrite(project: Project, db: OpDB) -> bool:
    """Whether a file must be (re)written; refuses to touch one edited by hand."""
    wanted = files(project, db)
    stale = False
    for rel, text in wanted.items():
        path = project.root / rel
        if not path.exists():
            stale = True
            continue
        current = path.read_text(errors="replace")
        if not is_pristine(current):
            raise ProjectError(
                f"{rel} was edited by hand and backendgen rewrites it; move your own registrations "
                "to a file of yours, then delete it and run the command again"
            )
        stale = stale or current != text
    return stale


def write(project: Project, db: OpDB, tx: Transaction) -> None:
    """Write the files whose text changed: one left alone keeps its time stamp, so the build does
    not compile it again (the point of cutting the registration in three)."""
    for rel, text in files(project, db).items():
        path = project.root / rel
        if not path.is_file() or path.read_text(errors="replace") != text:
            tx.write(path, text)
