"""The library entry points; the CLI is a thin layer over these, and tests call them directly.

    new_backend("mychip", Path("torch-mychip"))      # render, build, test
    add_ops(["aten::mul.Tensor"], Path("torch-mychip"))
    remove_ops(["aten::mul.out"], Path("torch-mychip"))   # kernel, test, registration, record
    build_backend(Path("torch-mychip"))               # rebuild after an edit
    test_backend(Path("torch-mychip"), opinfo=True)   # its tests and the OpInfo conformance suite
    list_ops("mul*", Path("torch-mychip"))
    check(Path("torch-mychip"))                       # accept=True: record the installed torch
    profile(Path("train.py"), ["--epochs", "1"], Path("torch-mychip"))  # what ran on the CPU fallback
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from backendgen import __version__, amp, build, customop, kernelgen, naming, overrides, render, support
from backendgen.errors import EnvironmentProblem, ProjectError, UserError
from backendgen.files import sha256_of
from backendgen.opdb import OpDB, load_opdb, torch_info
from backendgen.progress import Reporter
from backendgen.project import COMPILE_TESTS, DISTRIBUTED_TESTS, METADATA_FORMAT, REGISTRATION_FILE, OpRecord, Project, Transaction


def _torch_note(version: str, rep: Reporter) -> str | None:
    """Apply the support policy (backendgen.support): refuse a torch older than the minimum; for one
    that is not a tested release, report a note (once, before the work starts) and return it."""
    note = support.torch_support(version).note
    if note:
        rep.note(note)
    return note


# --- new ---------------------------------------------------------------------------------------

@dataclass
class NewResult:
    root: Path
    names: naming.Names
    ops: list[str]
    built: bool
    tested: bool
    backup: Path | None = None
    notes: list[str] = field(default_factory=list)
    torch_note: str | None = None  # support.Support.note: the installed torch is not a tested one


def new_backend(
    device: str,
    output: Path | None = None,
    *,
    package: str | None = None,
    devices: int = 2,
    build_it: bool = True,
    test_it: bool = True,
    force: bool = False,
    reporter: Reporter | None = None,
) -> NewResult:
    rep = reporter or Reporter()
    with rep.step("validate"):
        naming.check_device_name(device)
        if package is not None:
            naming.check_package_name(package)
        names = naming.derive(device, package)
        if not 1 <= devices <= 64:
            raise UserError(f"--devices must be between 1 and 64, not {devices}")
        dest = Path(output) if output is not None else Path.cwd() / names.dist_name
        dest = dest.absolute()
        render.check_destination(dest, force=force)
        stale = _check_not_installed_elsewhere(names, dest)
        info = torch_info()
        torch_note = _torch_note(info.version, rep)
        if build_it:
            build.check_toolchain()
            build.check_installable()
            _check_no_other_backend(names.dist_name)
            if test_it:
                build.check_test_tools()
        db = load_opdb(info)
        notes = []
        if stale is not None:
            build.uninstall(names.dist_name)
            notes.append(f"uninstalled {names.dist_name}: it was installed (editable) from {stale}, "
                         "which no longer exists")
    with rep.step("render"):
        manifest = render.template_manifest()
        context = {
            **names.context(),
            "num_devices": str(devices),
            "torch_version": info.public_version,
            "backendgen_version": __version__,
            "template_version": str(manifest["template_version"]),
        }
        with _writes(dest, "nothing was written"), render.staging_dir(dest) as staging:
            rendered = render.render_into(staging, context)
            project = Project(rendered, _initial_metadata(names, devices, db, manifest))
            for name in manifest["builtin_ops"]:
                op = db.resolve(name)
                project.add_op(
                    OpRecord(
                        op=op.qualified, schema=op.qualified_schema, signature=op.signature, source="csrc/aten",
                        origin="template", overloads=[o.qualified for o in db.overloads(op.base)],
                    )
                )
            tx = Transaction(rendered)
            added = [_write_op(project, db, kernelgen.plan_kernel(db, db.resolve(n)), tx) for n in manifest["default_ops"]]
            _write_registration(project, db, tx)
            project.save()
            backup = render.move_into_place(rendered, dest)
    result = NewResult(dest, names, added, built=False, tested=False, backup=backup, notes=notes,
                       torch_note=torch_note)
    if build_it:
        with rep.step("build"):
            build.build(dest, names.package, names.dist_name, incremental=False)
        result.built = True
        if test_it:
            with rep.step("test"):
                build.run_tests(dest)
            result.tested = True
    return result


@contextlib.contextmanager
def _writes(where: Path, outcome: str):
    """Turn a failing write (disk full, read-only file system, permissions) into a one-line error."""
    try:
        yield
    except OSError as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError)) or e.errno is None:
            raise
        detail = f" ({e.filename})" if e.filename else ""
        raise UserError(f"cannot write to {where}: {e.strerror}{detail}; {outcome}") from None


def _initial_metadata(names: naming.Names, devices: int, db: OpDB, manifest: dict) -> dict:
    # the template's autocast table, for the operators the installed torch has
    table = {"amp": {n: p for n, p in manifest["default_amp"].items() if db.get(n) is not None}} \
        if "default_amp" in manifest else {}
    return {
        "format": METADATA_FORMAT,
        "backendgen_version": __version__,
        "template_version": str(manifest["template_version"]),
        **names.context(),
        "num_devices": devices,
        "torch": {"version": db.torch_version, "native_functions_sha256": db.yaml_sha256},
        "ops": [],
        **table,
    }


def _check_not_installed_elsewhere(names: naming.Names, dest: Path) -> Path | None:
    """Refuse when the project's distribution is installed from elsewhere; return the directory of a
    stale editable install (one whose directory is gone, e.g. deleted after a failed `new`), which
    `new` replaces."""
    import importlib.metadata

    try:
        importlib.metadata.distribution(names.dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if build.installed_from(dest, names.dist_name):
        return None
    source = build.editable_source(names.dist_name)
    if source is not None and not source.exists():
        return source
    where = f"from {source}" if source is not None else "not from this directory"
    raise UserError(
        f"{names.dist_name} is already installed in this environment ({where}); "
        f"pip uninstall {names.dist_name}, use another device name, or another --package"
    )


def _check_no_other_backend(dist_name: str) -> None:
    """Only one PrivateUse1 backend can load per process; another autoloading one breaks the new one's tests."""
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="torch.backends"):
        dist = ep.dist.name if ep.dist is not None else ep.value
        if dist.replace("_", "-") != dist_name:
            raise EnvironmentProblem(
                f"another PrivateUse1 backend ({dist}) is installed and loads with every `import torch`; "
                f"only one can load per process: pip uninstall {dist}, or use --no-build"
            )


# --- add-op ------------------------------------------------------------------------------------

@dataclass
class AddOpsResult:
    root: Path
    added: list[str] = field(default_factory=list)  # qualified ops that got a kernel
    unchanged: list[str] = field(default_factory=list)  # requested ops that were already native
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    built: bool = False
    tested: bool = False
    torch_note: str | None = None  # support.Support.note: the installed torch is not a tested one


def _registration_text(project: Project, db: OpDB) -> str:
    fallbacks = []  # before template 5, fallback.cpp keeps run_on_cpu to itself
    if project.template_version >= 5:
        fallbacks = kernelgen.fallback_registrations(db, lambda op: project.covering(op) is not None)
    return kernelgen.render_registration(
        project.registrations, device=project.device, fallbacks=fallbacks, custom=_recorded_custom_ops(project),
        overrides=_recorded_overrides(project, db),
        amp=[(name, policy) for name, policy in amp.entries(project.amp_table or {}) if db.get(name) is not None],
    )


def _recorded_custom_ops(project: Project) -> list[customop.CustomOp]:
    out = []
    for d in project.custom_ops:
        try:
            out.append(customop.parse(project.device, d["op"], d["schema"], body=d.get("body"),
                                      autograd=bool(d.get("autograd"))))
        except UserError as e:
            raise ProjectError(f"backendgen.json: the record of {d['op'][:80]} is malformed ({e})") from None
    return out


def _recorded_overrides(project: Project, db: OpDB) -> list[overrides.Override]:
    """The recorded autograd overrides the installed torch still has (`check` reports the others)."""
    out = []
    for d in project.autograd_overrides:
        op = db.get(d["op"])
        if op is not None and op.qualified == d["op"]:
            out.append(overrides.Override(op, project.device))
    return out


def _check_registration(project: Project, db: OpDB) -> bool:
    """Whether the registration file must be (re)written; refuses to touch one edited by hand."""
    path = project.root / REGISTRATION_FILE
    if not path.exists():
        return True
    text = path.read_text(errors="replace")
    if not kernelgen.is_pristine_registration(text):
        raise ProjectError(
            f"{REGISTRATION_FILE} was edited by hand and backendgen rewrites it; move your own registrations "
            "to a file of yours, then delete it and run the command again"
        )
    return text != _registration_text(project, db)


def _edit_transaction(project: Project) -> Transaction:
    """A transaction for a command that edits and rebuilds the project: a rollback also restores the
    built extension (a failed build may have replaced it)."""
    tx = Transaction(project.root)
    so = build.extension_path(project.root, project.package)
    if so is not None:
        tx.touch_file(so)
    return tx


def _write_registration(project: Project, db: OpDB, tx: Transaction) -> None:
    tx.write(project.root / REGISTRATION_FILE, _registration_text(project, db))


def _paths(plan: kernelgen.KernelPlan) -> tuple[str, str]:
    stem = plan.file_stem
    return f"csrc/aten/ops/{stem}.cpp", f"tests/ops/test_{stem}.py"


def _write_op(project: Project, db: OpDB, plan: kernelgen.KernelPlan, tx: Transaction) -> str:
    """Write the kernel and test of one planned op and record it; return the qualified op."""
    source, test = _paths(plan)
    root = project.root
    kernel_text = kernelgen.render_kernel(plan, device=project.device, source_path=source, torch_version=db.torch_version)
    test_text = kernelgen.render_test(plan, device=project.device, source_path=source)
    for rel, text in ((source, kernel_text), (test, test_text)):
        path = root / rel
        if path.exists() and path.read_text() != text:
            raise ProjectError(
                f"{rel} exists but backendgen.json does not record it; move it away (or record it) before adding {plan.target.qualified}"
            )
        tx.write(path, text)
    _write_test_support(project, tx)
    for rec in op_records(project, db, plan, source_sha256=sha256_of(root / source)):
        project.add_op(rec)
    return plan.target.qualified


def op_records(project: Project, db: OpDB, plan: kernelgen.KernelPlan, *, source_sha256: str) -> list[OpRecord]:
    """The records of the kernel file of `plan` as written (`source_sha256`): one per kernel in the
    file, the target's, and the functional's if it has its own (add-op; update's regenerated kernels)."""
    source, test = _paths(plan)
    return [
        OpRecord(
            op=op.qualified,
            schema=op.qualified_schema,
            signature=op.signature,
            source=source,
            origin="add-op",
            test=test,
            requested=plan.requested.qualified,
            covers=[c for c in plan.covers if c != op.qualified] if op is plan.target else [],
            overloads=[o.qualified for o in db.overloads(op.base)],
            source_sha256=source_sha256,
            registration=kernelgen.registration_entry(plan, device=project.device, op=op),
        )
        for op in [plan.target] + ([plan.functional] if plan.functional else [])
    ]


def plan_ops(names: list[str], project: Project, db: OpDB) -> tuple[list[kernelgen.KernelPlan], list[str]]:
    """Plans for the ops not yet native in `project`, and the requested ops that already are."""
    plans, unchanged, seen = [], [], set()
    for name in names:
        # a project from template 1 has a kernel_support.h without the helpers newer kernels use
        plan = kernelgen.plan_kernel(db, db.resolve(name), legacy=project.template_version == 1)
        target = plan.target.qualified
        rec = project.covering(target)
        if rec is not None:
            if rec.source and rec.origin == "add-op" and not (project.root / rec.source).exists():
                raise ProjectError(
                    f"{target} is recorded but its kernel {rec.source} is missing; restore it (e.g. git checkout {rec.source})"
                )
            unchanged.append(plan.requested.qualified)
            continue
        if target in seen:
            continue
        seen.add(target)
        kernelgen.kernel_body(plan.target)  # refuse unsupported signatures before writing anything
        plans.append(plan)
    return plans, unchanged


@dataclass
class Extras:
    """What add-op plans besides ATen kernels: the backend's own operators and autograd overrides."""
    aten: list[str] = field(default_factory=list)  # names left for plan_ops
    custom: list[customop.CustomOp] = field(default_factory=list)
    overrides: list[overrides.Override] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def work(self) -> bool:
        return bool(self.custom or self.overrides)

    @property
    def tests(self) -> list[str]:
        return [c.test for c in self.custom] + [o.test for o in self.overrides]

    def files(self, package: str) -> list[tuple[str, list[str]]]:
        return [(c.qualified, c.files(package)) for c in self.custom] + [(o.op.qualified, o.files) for o in self.overrides]


def plan_extras(names: list[str], project: Project, db: OpDB, *, schema: str | None, body: str | None,
                autograd: bool) -> Extras:
    """Sort `names` into the backend's own operators (`<device>::NAME`, defined from `schema`), ATen
    autograd overrides (`autograd`) and plain ATen kernels; refuse what does not fit together."""
    device = project.device
    extras = Extras()
    custom_names = [n for n in names if customop.is_custom_name(n, device)]
    for n in names:
        ns, sep, _ = n.strip().partition("::")
        if sep and ns not in ("aten", device):
            raise UserError(f"{n[:80]!r}: add-op defines operators in this backend's namespace ({device}::NAME) "
                            "and writes kernels for aten:: operators")
    if (schema is not None or body is not None) and len(custom_names) != 1:
        raise UserError(f"--schema and --body define one operator of this backend: name exactly one {device}::NAME")
    if (custom_names or autograd) and project.template_version < customop.FIRST_TEMPLATE:
        raise ProjectError(
            f"this project is from template {project.template_version}: its setup.py does not compile csrc/custom_ops "
            f"or csrc/autograd; {device}:: operators and --autograd need template {customop.FIRST_TEMPLATE} "
            "or newer: run backendgen update"
        )
    recorded_custom = {d["op"]: d for d in project.custom_ops}
    recorded_overrides = {d["op"] for d in project.autograd_overrides}
    for n in names:
        if n in custom_names:
            rec = recorded_custom.get(f"{device}::{n.strip().removeprefix(device + '::')}")
            c = customop.parse(device, n, schema if schema is not None else (rec or {}).get("schema", ""), body=body,
                               autograd=autograd)
            if rec is not None:
                if rec["schema"] != c.schema:
                    raise ProjectError(f"{c.qualified} is already defined as {rec['schema']}; remove it before "
                                       "defining it again")
                extras.unchanged.append(c.qualified)
                continue
            if c.qualified in {x.qualified for x in extras.custom}:
                continue
            for rel in c.files(project.package):
                if (project.root / rel).exists():
                    raise ProjectError(f"{rel} exists but backendgen.json does not record it; move it away before "
                                       f"defining {c.qualified}")
            extras.custom.append(c)
            extras.notes += c.notes
        elif autograd:
            op = db.resolve(n)
            ov = overrides.plan(op, device)
            if op.qualified in recorded_overrides:
                extras.unchanged.append(op.qualified)
            elif op.qualified not in {o.op.qualified for o in extras.overrides}:
                for rel in ov.files:
                    if (project.root / rel).exists():
                        raise ProjectError(f"{rel} exists but backendgen.json does not record it; move it away "
                                           f"before overriding {op.qualified}")
                overrides.render(ov, torch_version=db.torch_version)  # refuses what it cannot write, before writing
                extras.overrides.append(ov)
                extras.notes.append(overrides.NOTE.format(op=op.qualified, source=ov.source))
        else:
            extras.aten.append(n)
    return extras


def _write_custom(project: Project, c: customop.CustomOp, tx: Transaction) -> str:
    root = project.root
    files = {c.source: customop.render_kernel(c), c.python_module(project.package): customop.render_wrapper(c, project.package),
             c.test: customop.render_test(c, project.package)}
    if c.autograd:
        files[c.autograd_source] = customop.render_autograd(c)
    for rel, text in files.items():
        tx.write(root / rel, text)
    _write_test_support(project, tx)
    project.record("custom_ops", {
        "op": c.qualified, "schema": c.schema, **({"body": c.body} if c.body else {}), "autograd": c.autograd,
        "signature": c.op.signature.replace(" NAME(", f" {c.name}(", 1),
        "source": c.source, **({"autograd_source": c.autograd_source} if c.autograd else {}),
        "python": c.python_module(project.package), "test": c.test,
        "source_sha256": sha256_of(root / c.source),
    })
    return c.qualified


def _write_override(project: Project, ov: overrides.Override, db: OpDB, tx: Transaction) -> str:
    root = project.root
    tx.write(root / ov.source, overrides.render(ov, torch_version=db.torch_version))
    tx.write(root / ov.test, overrides.render_test(ov))
    _write_test_support(project, tx)
    project.record("autograd_overrides", {
        "op": ov.op.qualified, "schema": ov.op.qualified_schema, "signature": ov.op.signature,
        "source": ov.source, "test": ov.test, "source_sha256": sha256_of(root / ov.source),
    })
    return ov.op.qualified


def _write_test_support(project: Project, tx: Transaction) -> None:
    harness = kernelgen.render_harness(device=project.device, registration_file=REGISTRATION_FILE)
    for rel, text in (("tests/ops/__init__.py", ""), ("tests/ops/harness.py", harness)):
        if not (project.root / rel).exists():
            tx.write(project.root / rel, text)


def add_ops(
    names: list[str],
    project_dir: Path | None = None,
    *,
    schema: str | None = None,
    body: str | None = None,
    autograd: bool = False,
    build_it: bool = True,
    test_it: bool = True,
    dry_run: bool = False,
    keep_on_failure: bool = False,
    reporter: Reporter | None = None,
) -> AddOpsResult:
    rep = reporter or Reporter()
    if not names:
        raise UserError("name at least one operator, e.g. aten::mul.Tensor")
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    result = AddOpsResult(project.root)
    with project.lock():
        with rep.step("resolve"):
            db = load_opdb()
            result.torch_note = _torch_note(db.torch_version, rep)
            if db.torch_version != project.torch_version:
                raise ProjectError(
                    f"the project was generated for torch {project.torch_version} but torch {db.torch_version} is installed; "
                    "run backendgen check and follow docs/upgrading.md first"
                )
            extras = plan_extras(names, project, db, schema=schema, body=body, autograd=autograd)
            result.unchanged += extras.unchanged
            result.notes += extras.notes
            plans, unchanged = plan_ops(extras.aten, project, db) if extras.aten else ([], [])
            result.unchanged += unchanged
            if (plans or extras.work) and build_it and test_it and not dry_run:
                build.check_test_tools()
            for plan in plans:
                result.notes.extend(plan.notes)
            rewrite_registration = _check_registration(project, db)
        if not plans and not extras.work and not rewrite_registration:
            return result
        if dry_run:
            for plan in plans:
                result.files += [project.root / p for p in _paths(plan)]
                result.added.append(plan.target.qualified)
            for qualified, files in extras.files(project.package):
                result.files += [project.root / f for f in files]
                result.added.append(qualified)
            result.files.append(project.root / REGISTRATION_FILE)
            return result
        tx = _edit_transaction(project)
        try:
            with rep.step("write"), _writes(project.root, "the project was left as it was"):
                result.added = [_write_op(project, db, plan, tx) for plan in plans]
                result.added += [_write_custom(project, c, tx) for c in extras.custom]
                result.added += [_write_override(project, ov, db, tx) for ov in extras.overrides]
                _write_registration(project, db, tx)
                tx.write(project.metadata_path, project_metadata_text(project))
                result.files = [p for p in tx.written if p.exists() and p.suffix != ".so"]
            if build_it:
                tests = [_paths(plan)[1] for plan in plans] + extras.tests if test_it else []
                # the tests' process imports torch and the OpInfo database while the kernels compile
                # (only into an installed project: a first install is not visible to a running process)
                early = tests and build.installed_from(project.root, project.data["dist_name"])
                with (build.tests_started_early(project.root, tests, name="add-op-test") if early
                      else contextlib.nullcontext()) as run_early:
                    with rep.step("build"):
                        build.build(project.root, project.package, project.data["dist_name"])
                    result.built = True
                    if tests:
                        with rep.step("test"):
                            if run_early is not None:
                                run_early()
                            else:
                                build.run_tests(project.root, tests, name="add-op-test")
                        result.tested = True
        except BaseException as exc:
            if keep_on_failure and not isinstance(exc, KeyboardInterrupt):
                if hasattr(exc, "hint"):
                    exc.hint = "the new files were kept (--keep-on-failure): " + ", ".join(
                        str(p.relative_to(project.root)) for p in result.files
                    )
            else:
                tx.rollback()
            raise
    return result


# --- remove-op ---------------------------------------------------------------------------------

@dataclass
class RemoveOpsResult:
    root: Path
    removed: list[str] = field(default_factory=list)  # qualified ops whose kernel is gone
    files: list[Path] = field(default_factory=list)  # deleted kernel and test files
    backups: list[Path] = field(default_factory=list)  # copies of edited files removed with force


def _records_named(project: Project, name: str) -> list[OpRecord]:
    """The records `name` designates: an operator as recorded, requested or covered ("aten::abs.out",
    "abs"), or a bare name for every overload recorded under it. Works for operators the
    installed torch no longer has (that is when a kernel is removed most often)."""
    bare = name.strip().removeprefix("aten::")
    qualified = f"aten::{bare}"
    found = [r for r in project.ops if qualified in (r.op, r.requested, *r.covers)]
    if not found and "." not in bare:
        found = [r for r in project.ops if r.op.removeprefix("aten::").split(".")[0] == bare]
    return found


def _extra_named(project: Project, name: str, autograd: bool) -> tuple[str, dict] | None:
    """The record of the backend's own operator `name`, or (with `autograd`) of the autograd
    override of ATen operator `name`, as (its section in backendgen.json, the record)."""
    if customop.is_custom_name(name, project.device):
        qualified = name.strip()
        rec = next((d for d in project.custom_ops if d["op"] == qualified), None)
        if rec is None:
            have = ", ".join(d["op"] for d in project.custom_ops) or "none"
            raise ProjectError(f"{qualified[:80]!r} is not an operator of this backend (defined: {have})")
        return "custom_ops", rec
    if autograd:
        bare = name.strip().removeprefix("aten::")
        rec = next((d for d in project.autograd_overrides
                    if d["op"].removeprefix("aten::") in (bare, f"{bare}.default")
                    or d["op"].removeprefix("aten::").split(".")[0] == bare), None)
        if rec is None:
            have = ", ".join(d["op"] for d in project.autograd_overrides) or "none"
            raise ProjectError(f"{name[:80]!r} has no autograd override in this project (overridden: {have})")
        return "autograd_overrides", rec
    return None


def _extra_files(rec: dict) -> list[str]:
    return [f for f in (rec.get("source"), rec.get("autograd_source"), rec.get("python"), rec.get("test")) if f]


def remove_ops(names: list[str], project_dir: Path | None = None, *, force: bool = False,
               autograd: bool = False) -> RemoveOpsResult:
    """Remove kernels that add-op wrote: the kernel file, its test, their records in
    backendgen.json and their lines in the generated registration file, in one transaction.
    `<device>::NAME` removes an operator of the backend (its kernels, autograd, wrapper and test);
    with `autograd`, `aten::OP` removes the autograd override of OP.
    A kernel file edited since add-op wrote it is refused unless `force`, which keeps a copy
    beside it (`<file>.removed-<time>`). Nothing is rebuilt: removing a kernel is often a step
    of an upgrade, when the project does not build yet; `backendgen build` follows."""
    import shutil
    import time

    if not names:
        raise UserError("name at least one operator, e.g. aten::cholesky")
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    result = RemoveOpsResult(project.root)
    with project.lock():
        sources: dict[str, list[OpRecord]] = {}
        extras: list[tuple[str, dict]] = []
        for name in names:
            extra = _extra_named(project, name, autograd)
            if extra is not None:
                extras.append(extra)
                continue
            found = _records_named(project, name)
            if not found:
                native = sorted(r.op for r in project.ops if r.origin == "add-op")
                raise ProjectError(
                    f"{name!r} has no kernel in this project"
                    + (f" (kernels added with add-op: {', '.join(native)})" if native else " (no kernel was added with add-op)")
                )
            for rec in found:
                if rec.origin != "add-op":
                    raise ProjectError(
                        f"{rec.op} is part of the template ({rec.source}), not a kernel add-op wrote; edit that file instead"
                    )
                sources.setdefault(rec.source, [])
        for rec in project.ops:  # every kernel of a removed file: a structured op's functional too
            if rec.source in sources:
                sources[rec.source].append(rec)
        db = load_opdb()
        _check_registration(project, db)  # refuses a registration file edited by hand
        edited = [src for src, recs in sources.items() if (project.root / src).exists()
                  and any(r.source_sha256 and r.source_sha256 != sha256_of(project.root / src) for r in recs)]
        edited += [rec["source"] for _, rec in extras if (project.root / rec["source"]).exists()
                   and rec.get("source_sha256") and rec["source_sha256"] != sha256_of(project.root / rec["source"])]
        if edited and not force:
            raise ProjectError(
                f"{', '.join(edited)} changed since add-op wrote it; pass --force to remove it anyway "
                "(a copy is kept beside it)"
            )
        tx = Transaction(project.root)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            with _writes(project.root, "the project was left as it was"):
                groups = [(src, [src, *sorted({r.test for r in recs if r.test})], recs) for src, recs in sources.items()]
                groups += [(rec["source"], _extra_files(rec), []) for _, rec in extras]
                for src, files, recs in groups:
                    for rel in files:
                        path = project.root / rel
                        if not path.exists():
                            continue
                        if src in edited:
                            backup = path.with_name(f"{path.name}.removed-{stamp}")
                            tx.touch_file(backup)  # a rollback removes the copy again
                            shutil.copy2(path, backup)
                            result.backups.append(backup)
                        tx.remove(path)
                        result.files.append(path)
                    for rec in recs:
                        project.remove_op(rec.op)
                        result.removed.append(rec.op)
                for section, rec in extras:
                    project.unrecord(section, rec["op"])
                    result.removed.append(rec["op"])
                _write_registration(project, db, tx)  # the installed torch's: remove-op is an upgrade step
                tx.write(project.metadata_path, project_metadata_text(project))
        except BaseException:
            tx.rollback()
            raise
    return result


def project_metadata_text(project: Project) -> str:
    import json

    return json.dumps(project.data, indent=2) + "\n"


# --- amp ---------------------------------------------------------------------------------------

@dataclass
class AmpRow:
    op: str  # "aten::mm"
    policy: str
    meaning: str


def amp_list(project_dir: Path | None = None) -> list[AmpRow]:
    """The project's autocast table."""
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    amp.check_supported(project.template_version)
    return [AmpRow(f"aten::{name}", policy, amp.POLICIES[policy]) for name, policy in amp.entries(project.amp_table or {})]


@dataclass
class AmpSetResult:
    root: Path
    op: str
    policy: str
    previous: str  # "none" when the operator was not in the table
    built: bool = False
    tested: bool = False


def amp_set(name: str, policy: str, project_dir: Path | None = None, *, build_it: bool = True, test_it: bool = True,
            reporter: Reporter | None = None) -> AmpSetResult:
    """Set the autocast policy of one operator ("none" takes it out of the table), rewrite the
    registration file, rebuild and run the table's test for that operator; on failure the project is
    left as it was."""
    rep = reporter or Reporter()
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    amp.check_supported(project.template_version)
    policy = amp.check_policy(policy)
    with project.lock():
        db = load_opdb()
        if db.torch_version != project.torch_version:
            raise ProjectError(
                f"the project was generated for torch {project.torch_version} but torch {db.torch_version} is installed; "
                "run backendgen check and follow docs/upgrading.md first"
            )
        op = db.resolve(name)
        table = project.amp_table or {}
        previous = table.get(op.name, "none")
        result = AmpSetResult(project.root, op.qualified, policy, previous)
        _check_registration(project, db)
        if previous == policy:
            return result
        if policy == "none":
            table.pop(op.name, None)
        else:
            table[op.name] = policy
        project.data["amp"] = dict(sorted(table.items()))
        tx = _edit_transaction(project)
        try:
            with rep.step("write"), _writes(project.root, "the project was left as it was"):
                _write_registration(project, db, tx)
                tx.write(project.metadata_path, project_metadata_text(project))
            if build_it:
                with rep.step("build"):
                    build.build(project.root, project.package, project.data["dist_name"])
                result.built = True
                if test_it and policy != "none":
                    with rep.step("test"):
                        build.run_tests(project.root, [f"{amp.TEST_FILE}::test_policy_takes_effect_under_autocast[{op.name}]"],
                                        name="amp-test")
                    result.tested = True
        except BaseException:
            tx.rollback()
            raise
    return result


# --- ops ---------------------------------------------------------------------------------------

@dataclass
class OpStatus:
    name: str
    status: str  # native | fallback | default | composite
    core: bool
    schema: str


def list_ops(pattern: str | None = None, project_dir: Path | None = None, *, required: bool = False) -> list[OpStatus]:
    project = None
    if project_dir is not None:
        project = Project.load(Path(project_dir))
    else:
        try:
            project = Project.find()
        except ProjectError:
            project = None
    db = load_opdb()
    pat = (pattern or "*").removeprefix("aten::")
    if not any(ch in pat for ch in "*?["):
        pat = f"*{pat}*"
    rows = []
    for op in db.all():
        if not fnmatch.fnmatchcase(op.name, pat):
            continue
        if required and not op.needs_backend_kernel:
            continue
        if project is not None and project.covering(op.qualified) is not None:
            status = "native"
        elif op.structured_delegate or {"CPU", "CompositeExplicitAutograd"} <= set(op.dispatch_keys):
            status = "fallback"  # registered to the fallback by name (kernelgen.fallback_registrations)
        elif op.composite_implicit:
            status = "composite"
        elif op.needs_backend_kernel:
            status = "fallback"
        else:
            status = "default"
        rows.append(OpStatus(op.qualified, status, "core" in op.tags, op.qualified_schema))
    rows.sort(key=lambda r: (not r.core, r.name))
    return rows


# --- build -------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    root: Path
    log: Path
    how: build.How  # How.FAST: only ninja and the link ran
    why_full: str | None = None  # why setup.py (or pip) had to run
    tested: bool = False


def build_backend(project_dir: Path | None = None, *, test_it: bool = False, full: bool = False,
                  reporter: Reporter | None = None) -> BuildResult:
    """Rebuild a project after its sources changed; `full` always goes through setup.py."""
    rep = reporter or Reporter()
    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    if test_it or not build.installed_from(project.root, project.data["dist_name"]):
        _check_no_other_backend(project.data["dist_name"])  # its tests, or the install, would break
    if test_it:
        build.check_test_tools()
    with project.lock():
        with rep.step("build"):
            outcome = build.build(project.root, project.package, project.data["dist_name"], allow_fast=not full)
        result = BuildResult(project.root, outcome.log, outcome.how, outcome.why_full)
        if test_it:
            with rep.step("test"):
                build.run_tests(project.root)
            result.tested = True
    return result


# --- test --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OptInSuite:
    """A part of a generated project's tests that its pytest settings leave out by default (slow:
    each `backendgen test --<option>` runs one after the project's quick suite)."""

    option: str  # the `backendgen test` option, without dashes
    marker: str  # the pytest marker that selects it
    path: str  # where it lives in the project
    what: str  # for messages: "torch.compile tests"
    since: int  # the template version that added it


OPT_IN_SUITES = (
    OptInSuite("compile", "compile", COMPILE_TESTS, "torch.compile tests", 6),
    OptInSuite("distributed", "distributed", DISTRIBUTED_TESTS, "multi-process tests", 6),
)


@dataclass
class SuiteRun:
    suite: OptInSuite
    log: Path | None = None
    failure: str | None = None  # why it failed (None: it passed)


@dataclass
class TestResult:
    __test__ = False  # not a pytest test class

    root: Path
    tests_log: Path | None = None
    tests_failure: str | None = None  # why the project's tests failed (None: they passed)
    suite: object | None = None  # conformance.SuiteResult, with opinfo
    opt_in: list[SuiteRun] = field(default_factory=list)  # the opt-in suites asked for, in order

    @property
    def exit_code(self) -> int:
        failed = self.tests_failure or any(run.failure for run in self.opt_in)
        return 1 if failed or (self.suite is not None and not self.suite.ok) else 0


def test_backend(project_dir: Path | None = None, *, opinfo: bool = False, opt_in: tuple[str, ...] = (),
                 patterns: list[str] | None = None,
                 dtypes: list[str] | None = None, samples: int | None = None, workers: int | None = None,
                 strict: bool = False, write_expected: Path | None = None,
                 reporter: Reporter | None = None) -> TestResult:
    """Run the project's tests; with `opinfo` also its conformance suite (backendgen.conformance);
    then each opt-in suite named in `opt_in` (OPT_IN_SUITES: "compile", "distributed"). Failures
    are in the result (exit_code 1); bad arguments raise UserError."""
    from backendgen import conformance
    from backendgen.errors import TestFailure

    rep = reporter or Reporter()
    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    if build.extension_path(project.root, project.package) is None:
        raise ProjectError(f"{project.root} is not built yet; run backendgen build --project {project.root}")
    _check_no_other_backend(project.data["dist_name"])
    if not opinfo and (patterns or dtypes or samples is not None or workers is not None or strict or write_expected):
        raise UserError("-k, --dtype, --samples, --workers, --strict and --write-expected select the conformance suite: add --opinfo")
    by_option = {s.option: s for s in OPT_IN_SUITES}
    unknown = [name for name in opt_in if name not in by_option]
    if unknown:
        raise UserError(f"no opt-in test suite {unknown[0]!r}; there are: {', '.join(by_option)}")
    suites = [by_option[name] for name in dict.fromkeys(opt_in)]
    for s in suites:
        if not (project.root / s.path).exists():
            raise ProjectError(f"{project.root} has no {s.what} ({s.path}, template {s.since} and later); "
                               "docs/upgrading.md says how an older project takes them over")
    result = TestResult(project.root)
    with project.lock():
        if opinfo:  # first: it checks its arguments before anything runs
            with rep.step("conformance"):
                result.suite = conformance.run_suite(
                    project.root, patterns=patterns, dtypes=dtypes, samples=samples, workers=workers, strict=strict,
                    write_expected=write_expected,
                )
        with rep.step("test"):
            try:
                result.tests_log = build.run_tests(project.root)
            except TestFailure as e:
                result.tests_failure, result.tests_log = str(e), e.log
        for s in suites:
            run = SuiteRun(s)
            with rep.step(s.option):
                try:
                    run.log = build.run_tests(project.root, [s.path], name=s.option, marker=s.marker)
                except TestFailure as e:
                    run.failure, run.log = str(e), e.log
            result.opt_in.append(run)
    return result


# --- check -------------------------------------------------------------------------------------

def check(project_dir: Path | None = None, *, strict: bool = False, list_ops: bool = False, accept: bool = False):
    """Check the project against the installed torch. With `accept`, a check without errors (and
    without warnings under `strict`) then records that the project targets the installed torch:
    its version, its native_functions.yaml hash, and the schemas and C++ signatures of the
    operators that changed only in names (report.accepted says what; add-op works again)."""
    from backendgen.check import check_project

    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    if not accept:
        return check_project(project, strict=strict, list_ops=list_ops)
    with project.lock():
        report = check_project(project, strict=strict, list_ops=list_ops)
        if report.exit_code == 0:
            report.accepted = _accept(project, load_opdb())
    return report


def _accept(project: Project, db: OpDB) -> dict:
    from backendgen.check import signature_types

    before = dict(project.data["torch"])
    updated = []
    for rec in project.ops:
        op = db.get(rec.op)
        if op is None or signature_types(op.signature) != signature_types(rec.signature):
            raise ProjectError(f"{rec.op} does not fit the installed torch; run backendgen check")  # check said it does
        overloads = [o.qualified for o in db.overloads(op.base)] if rec.overloads else rec.overloads
        if (rec.schema, rec.signature, rec.overloads) != (op.qualified_schema, op.signature, overloads):
            rec.schema, rec.signature, rec.overloads = op.qualified_schema, op.signature, overloads
            project.add_op(rec)
            updated.append(rec.op)
    project.data["torch"] = {"version": db.torch_version, "native_functions_sha256": db.yaml_sha256}
    changed = project.data["torch"] != before or bool(updated)
    # the registration file names operators of the installed torch (kernelgen.fallback_registrations)
    rewrite = _check_registration(project, db)
    if changed or rewrite:
        tx = Transaction(project.root)
        try:
            with _writes(project.root, "backendgen.json was left as it was"):
                if rewrite:
                    _write_registration(project, db, tx)
                tx.write(project.metadata_path, project_metadata_text(project))
        except BaseException:
            tx.rollback()
            raise
    return {"changed": changed or rewrite, "from": before["version"], "to": db.torch_version, "updated_ops": sorted(updated),
            "rebuild": rewrite}


# --- profile -----------------------------------------------------------------------------------

def profile(script: Path, args: list[str] | None = None, project_dir: Path | None = None, *,
            stdout_to_stderr: bool = False):
    """Run `script` (with `args`) on the project's backend and return what ran on the CPU fallback,
    ranked, with the `backendgen add-op` argument for each operator (a `profile.ProfileResult`).

    The script's output goes where this process's goes (`stdout_to_stderr`: its stdout to stderr,
    to keep stdout for a machine-readable report). A script that fails still gets its profile: its
    exit status is in the result."""
    from backendgen import profile as prof

    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    script = Path(script)
    if not script.exists():
        raise UserError(f"no such script: {script}")
    if script.is_dir() and not (script / "__main__.py").is_file():
        raise UserError(f"{script} is a directory without __main__.py, not a script")
    prof.check_installed(project)
    status, data = prof.run(script, list(args or []), project.device, stdout_to_stderr=stdout_to_stderr)
    if data is not None and data.get("error") == "import":
        raise EnvironmentProblem(f"import torch failed in the script's process: {data.get('detail')}")
    if data is not None and data.get("error") == "not_loaded":
        raise ProjectError(
            f"`import torch` did not load the {project.device} backend (torch.{project.device} is missing; see the "
            f"warning above, if any); rebuild it: backendgen build --project {project.root}"
        )
    result = prof.ProfileResult(project.root, project.device, script, list(args or []), status, None, collected=False)
    if data is None or "stats" not in data:
        detail = f": {data['detail']}" if data and data.get("detail") else ""
        result.notes.append(f"the script {prof.status_text(status)} before its profile could be collected{detail}")
        return result
    result.collected = True
    result.seconds = data["seconds"]
    db = load_opdb()
    result.entries = prof.analyze(data["stats"], db, project)
    result.command = prof.add_op_command(result.targets, project.root if project_dir is not None else None)
    if db.torch_version != project.torch_version:
        result.notes.append(
            f"the project was generated for torch {project.torch_version} but torch {db.torch_version} is installed: "
            "add-op refuses until the project is upgraded (backendgen check, docs/upgrading.md)"
        )
    if any(e.seconds is None for e in result.entries):
        result.notes.append("this backend counts fallback calls but not their time (a project from an older template)")
    if status != 0:
        result.notes.append(f"the script {prof.status_text(status)}; the profile covers what ran until then")
    return result


# --- update ------------------------------------------------------------------------------------

def update_project(project_dir: Path | None = None, *, dry_run: bool = False, torch_signatures: bool = False,
                   build_it: bool = True, test_it: bool = True, allow_dirty: bool = False,
                   keep_on_failure: bool = False, reporter: Reporter | None = None):
    """Carry a project to the current template (backendgen.update): tool-owned files rewritten, the
    others merged 3-way so no hand edit is lost, add-op's kernels brought to the current kernel
    shape. With `torch_signatures`, first re-derive every recorded operator's signature from the
    installed torch and fix the kernels where only types changed; then check.

    One transaction: a failure or an interrupt puts every file back. Conflicts are left with
    markers, listed in the result (exit_code 1) and recorded; nothing is built then. A project in a
    git work tree with uncommitted changes is refused unless `allow_dirty`. `dry_run`: the
    result's diff says what would change, nothing is written."""
    from backendgen import history
    from backendgen import update as upd
    from backendgen.check import check_project
    from backendgen.project import METADATA_FILE

    rep = reporter or Reporter()
    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    old, new = upd.recorded_version(project), history.current_version()
    result = upd.UpdateResult(project.root, old, new, dry_run=dry_run)
    if not dry_run and not allow_dirty:
        dirty = upd.git_dirty(project.root)
        if dirty:
            more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
            raise ProjectError(f"{project.root} has uncommitted changes ({dirty[0]}{more}); commit or stash them, "
                               "or pass --allow-dirty")
    with project.lock():
        with rep.step("plan"):
            result.unresolved = upd.pending_conflicts(project)
            if result.unresolved:
                return result  # an earlier update's conflicts first
            db = load_opdb()
            if db.torch_version != project.torch_version and not torch_signatures:
                raise ProjectError(
                    f"the project targets torch {project.torch_version} but torch {db.torch_version} is installed; "
                    "pass --torch to move it to the installed torch too (or install the project's torch)"
                )
            _check_registration(project, db)  # refuses a registration file edited by hand
            plan = upd.Plan(project.root)
            old_torch = project.torch_version
            skip = upd.plan_torch(project, db, plan, result) if torch_signatures else set()
            if old < new or torch_signatures:
                with history.template_of(old) as old_dir:
                    if old < new:
                        upd.plan_template(project, plan, result, old=old, old_dir=old_dir)
                    upd.plan_kernels(project, db, plan, result, old=old, old_dir=old_dir, old_torch=old_torch, skip=skip)
            if old < new:
                project.data["template_version"] = str(new)
                project.data["backendgen_version"] = __version__
                upd.refresh_template_records(project, db)
            if torch_signatures and not result.unfixable:
                project.data["torch"] = {"version": db.torch_version, "native_functions_sha256": db.yaml_sha256}
                result.torch_recorded = db.torch_version
            if result.conflicts:
                project.data["update"] = {"from": old, "to": new, "conflicts": sorted(set(result.conflicts))}
            else:
                project.data.pop("update", None)
            plan.write(REGISTRATION_FILE, _registration_text(project, db))
            if REGISTRATION_FILE in plan.writes:
                result.changes.append(upd.FileChange(REGISTRATION_FILE, upd.Action.REWRITTEN))
            plan.write(METADATA_FILE, project_metadata_text(project))
            if METADATA_FILE in plan.writes:
                result.changes.append(upd.FileChange(METADATA_FILE, upd.Action.REWRITTEN))
            result.diff = plan.diff()
        if dry_run or not plan.writes:
            if torch_signatures and not dry_run:
                with rep.step("check"):
                    result.check = check_project(Project.load(project.root))
            return result
        build_it = build_it and not result.conflicts and not result.unfixable  # nothing to build until resolved
        if build_it:  # before anything is written
            build.check_toolchain()
            _check_no_other_backend(project.data["dist_name"])
            if test_it:
                build.check_test_tools()
        tx = _edit_transaction(project)
        try:
            with rep.step("write"), _writes(project.root, "the project was left as it was"):
                for rel, text in plan.writes.items():
                    if text is None:
                        tx.remove(project.root / rel)
                    else:
                        tx.write(project.root / rel, text)
                        if rel in plan.modes:
                            (project.root / rel).chmod(plan.modes[rel])
            if build_it:
                with rep.step("build"):
                    # through pip: the template may have changed setup.py, pyproject.toml or the packages
                    build.build(project.root, project.package, project.data["dist_name"], incremental=False)
                result.built = True
                if test_it:
                    with rep.step("test"):
                        build.run_tests(project.root)
                    result.tested = True
        except BaseException as exc:
            if keep_on_failure and not isinstance(exc, KeyboardInterrupt):
                if hasattr(exc, "hint"):
                    exc.hint = "the updated files were kept (--keep-on-failure); git diff shows them"
            else:
                tx.rollback()
            raise
    if torch_signatures:
        with rep.step("check"):
            result.check = check_project(Project.load(project.root))
    return result
