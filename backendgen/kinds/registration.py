"""The generated registration file, `csrc/aten/ops/generated/registration.cpp` (Project.registration_file).

It holds the `m.impl` of every kernel add-op wrote, the CPU fallback registered by name for the
operators that need it, the backend's own operators (`m.def` and their kernels), the autograd
overrides and the autocast table. It is tool-owned: written from backendgen.json and the installed
torch, sealed on its last line with the hash of the rest, so that a later command can tell a file
it may rewrite (whatever the metadata says, e.g. after a run killed half-way) from one edited by
hand, which it refuses to touch. A deleted file is simply written again.
"""

from __future__ import annotations

from backendgen.kinds import customop, jinja
from backendgen.plumbing.errors import ProjectError
from backendgen.plumbing.files import sha256_text
from backendgen.project import amp
from backendgen.project.on_disk import Project, Transaction
from backendgen.torchdb.opdb import OpDB

_SEAL = "// backendgen sha256: "


def render(
    entries: list[dict] = (),
    *,
    device: str,
    fallbacks: list[str] = (),
    custom=(),
    overrides=(),
    amp: list[tuple[str, str]] = (),
) -> str:
    """The file's text: one m.impl per generated kernel (`entries`: kernelgen.registration_entry), sorted
    by operator, the CPU fallback registered by name for `fallbacks` (kinds.aten_kernel.fallback_registrations), the
    backend's own operators (`custom`: customop.CustomOp), autograd overrides (`overrides`:
    overrides.Override) and the autocast table (`amp`: (operator, policy) pairs); then the seal."""
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
        )
    )
    return f"{text}{_SEAL}{sha256_text(text)}\n"


def is_pristine(text: str) -> bool:
    """Whether `text` is a registration file exactly as backendgen wrote it."""
    body, sep, seal = text.rstrip("\n").rpartition("\n" + _SEAL)
    return bool(sep) and seal == sha256_text(body + "\n")


def text(project: Project, db: OpDB) -> str:
    """The file `project` needs with the installed torch (`db`), from its backendgen.json: each operator
    kind's lines (kinds.registry), then the autocast table."""
    from backendgen.kinds.registry import KINDS

    context = {}
    for kind in KINDS:
        context.update(kind.registration(project, db))
    amp_table = [(name, policy) for name, policy in amp.entries(project.amp_table or {}) if db.get(name) is not None]
    return render(device=project.device, amp=amp_table, **context)


def needs_rewrite(project: Project, db: OpDB) -> bool:
    """Whether the file must be (re)written; refuses to touch one edited by hand."""
    path = project.root / project.registration_file
    if not path.exists():
        return True
    current = path.read_text(errors="replace")
    if not is_pristine(current):
        raise ProjectError(
            f"{project.registration_file} was edited by hand and backendgen rewrites it; move your own registrations "
            "to a file of yours, then delete it and run the command again"
        )
    return current != text(project, db)


def write(project: Project, db: OpDB, tx: Transaction) -> None:
    tx.write(project.root / project.registration_file, text(project, db))
