"""`backendgen new`: render the template into a new project, record it, build and test it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backendgen import __version__
from backendgen.commands import addop
from backendgen.commands.transaction import check_no_other_backend
from backendgen.kinds import kernelgen, registration
from backendgen.kinds.aten_kernel import template_record, write_op
from backendgen.plumbing import faults
from backendgen.plumbing.errors import UserError
from backendgen.plumbing.files import writes
from backendgen.plumbing.progress import Reporter
from backendgen.project import drivers, history, manifest, naming, render
from backendgen.project.on_disk import Project, Transaction
from backendgen.project.record import Record, TorchTarget
from backendgen.toolchain import build
from backendgen.torchdb.opdb import OpDB, load_opdb, torch_info


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
    driver: str = "emulator"  # the device driver it was made with (backendgen.project.drivers)


def new_backend(
    device: str,
    output: Path | None = None,
    *,
    package: str | None = None,
    devices: int = 2,
    driver: str = "emulator",
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
        tpl = manifest.load()
        drivers.check(driver, tpl)  # the template's drivers (backendgen.project.drivers)
        dest = Path(output) if output is not None else Path.cwd() / names.dist_name
        dest = dest.absolute()
        render.check_destination(dest, force=force)
        stale = _check_not_installed_elsewhere(names, dest)
        info = torch_info()
        torch_note = addop.torch_note(info.version, rep)
        if build_it:
            build.check_toolchain()
            build.check_installable()
            check_no_other_backend(names.dist_name)
            if test_it:
                build.check_test_tools()
        db = load_opdb(info)
        notes = []
        if stale is not None:
            build.uninstall(names.dist_name)
            notes.append(
                f"uninstalled {names.dist_name}: it was installed (editable) from {stale}, which no longer exists"
            )
    with rep.step("render"):
        added, backup = _write_project(dest, names, devices, driver, info.public_version, db, tpl)
    result = NewResult(
        dest, names, added, built=False, tested=False, backup=backup, notes=notes, torch_note=torch_note, driver=driver
    )
    if build_it:
        _build_and_test(result, rep, test_it=test_it)
    return result


def _write_project(
    dest: Path, names: naming.Names, devices: int, driver: str, torch_version: str, db: OpDB, tpl: manifest.Manifest
) -> tuple[list[str], Path | None]:
    """Render the template into a staging directory, record it, write its default kernels and
    registration, and move it into place at `dest`: (the operators it wrote, the backup --force made)."""
    context = {
        **names.context(),
        "num_devices": str(devices),
        "driver": driver,
        "torch_version": torch_version,
        "backendgen_version": __version__,
        "template_version": str(tpl.template_version),
    }
    with writes(dest, "nothing was written"), render.staging_dir(dest) as staging:
        rendered = render.render_into(staging, context)
        project = Project(rendered, _initial_record(names, devices, driver, db, tpl))
        for name in tpl.builtin_ops():
            project.add_op(template_record(project, db, db.resolve(name)))
        tx = Transaction(rendered)
        # the template's default operators, and a view kernel for every view operator of this
        # torch that would otherwise reach the CPU fallback (derived, not listed: docs/architecture.md)
        views, _ = kernelgen.view_ops_needing_kernels(db, tpl.builtin_ops())
        wanted = list(dict.fromkeys([*tpl.default_ops, *views]))
        added = [write_op(project, db, kernelgen.plan_kernel(db, db.resolve(n)), tx) for n in wanted]
        registration.write(project, db, tx)
        project.save()
        backup = render.move_into_place(rendered, dest)
    return added, backup


def _build_and_test(result: NewResult, rep: Reporter, *, test_it: bool) -> None:
    """Build the new project (an interrupted build removes it again), then run its tests."""
    dest, names = result.root, result.names
    try:
        faults.reached("new:rendered")
        with rep.step("build", build.watch_build(dest)):
            build.build(dest, names.package, names.dist_name, incremental=False)
        result.built = True
    except KeyboardInterrupt:
        _unmake(dest, result.backup)  # interrupted: as if `new` had not run, so that running it again works
        raise
    if test_it:
        with rep.step("test", build.watch_tests(dest)):
            build.run_tests(dest)
        result.tested = True


def _unmake(dest: Path, backup: Path | None) -> None:
    """Remove the project `new` just moved into place (and put back the one --force moved aside).
    An editable install pip made of it is left; the next `new` replaces it (its directory is gone)."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    if backup is not None and not dest.exists():
        backup.rename(dest)


def _initial_record(names: naming.Names, devices: int, driver: str, db: OpDB, tpl: manifest.Manifest) -> Record:
    return Record(
        backendgen_version=__version__,
        template_version=str(tpl.template_version),
        template_state=history.current_state(),  # the exact template (backendgen.project.template_tree)
        device=names.device,
        DEVICE=names.DEVICE,
        package=names.package,
        dist_name=names.dist_name,
        num_devices=devices,
        driver=driver,
        torch=TorchTarget(version=db.torch_version, native_functions_sha256=db.yaml_sha256),
        # the template's autocast table, for the operators the installed torch has
        amp={n: p for n, p in tpl.default_amp.items() if db.get(n) is not None},
    )


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
