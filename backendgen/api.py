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

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from backendgen import __version__
from backendgen.commands import addop, consistency
from backendgen.project import amp, history, manifest, naming, render
from backendgen.toolchain import build
from backendgen.plumbing import faults
from backendgen.kinds import kernelgen, registration
from backendgen.commands.addop import AddOpsResult, RemoveOpsResult
from backendgen.torchdb.drift import Drift, classify
from backendgen.plumbing.errors import EnvironmentProblem, NotAProjectError, ProjectError, UserError
from backendgen.torchdb.opdb import OpDB, load_opdb, torch_info
from backendgen.plumbing.progress import Reporter
from backendgen.project.on_disk import METADATA_FORMAT, Project, Transaction


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
        torch_note = addop.torch_note(info.version, rep)
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
        tpl = manifest.load()
        context = {
            **names.context(),
            "num_devices": str(devices),
            "torch_version": info.public_version,
            "backendgen_version": __version__,
            "template_version": str(tpl.template_version),
        }
        with addop.writes(dest, "nothing was written"), render.staging_dir(dest) as staging:
            rendered = render.render_into(staging, context)
            project = Project(rendered, _initial_metadata(names, devices, db, tpl))
            for name in tpl.builtin_ops():
                project.add_op(addop.template_record(db, db.resolve(name)))
            tx = Transaction(rendered)
            # the template's default operators, and a view kernel for every view operator of this
            # torch that would otherwise reach the CPU fallback (derived, not listed: docs/architecture.md)
            views, _ = kernelgen.view_ops_needing_kernels(db, tpl.builtin_ops())
            wanted = list(dict.fromkeys([*tpl.default_ops, *views]))
            added = [addop.write_op(project, db, kernelgen.plan_kernel(db, db.resolve(n)), tx) for n in wanted]
            registration.write(project, db, tx)
            project.save()
            backup = render.move_into_place(rendered, dest)
    result = NewResult(dest, names, added, built=False, tested=False, backup=backup, notes=notes,
                       torch_note=torch_note)
    if build_it:
        try:
            faults.reached("new:rendered")
            with rep.step("build"):
                build.build(dest, names.package, names.dist_name, incremental=False)
            result.built = True
        except KeyboardInterrupt:
            _unmake(dest, backup)  # interrupted: as if `new` had not run, so that running it again works
            raise
        if test_it:
            with rep.step("test"):
                build.run_tests(dest)
            result.tested = True
    return result


def _unmake(dest: Path, backup: Path | None) -> None:
    """Remove the project `new` just moved into place (and put back the one --force moved aside).
    An editable install pip made of it is left; the next `new` replaces it (its directory is gone)."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    if backup is not None and not dest.exists():
        backup.rename(dest)


def _initial_metadata(names: naming.Names, devices: int, db: OpDB, tpl: manifest.Manifest) -> dict:
    # the template's autocast table, for the operators the installed torch has
    table = {"amp": {n: p for n, p in tpl.default_amp.items() if db.get(n) is not None}}
    return {
        "format": METADATA_FORMAT,
        "backendgen_version": __version__,
        "template_version": str(tpl.template_version),
        "template_state": history.current_state(),  # the exact template (backendgen.project.template_tree)
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
    """Give the named ATen operators kernels of the backend's own (and their tests), define the
    backend's own operator `<device>::NAME` (`schema`, `body`, `autograd`), or override the
    derivative of ATen operators (`autograd`); then build and test. One transaction: a failure puts
    every file back unless `keep_on_failure`. The engine is backendgen.commands.addop."""
    if not names:
        raise UserError("name at least one operator, e.g. aten::mul.Tensor")
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    return addop.add(project, names, schema=schema, body=body, autograd=autograd, build_it=build_it, test_it=test_it,
                     dry_run=dry_run, keep_on_failure=keep_on_failure, rep=reporter or Reporter())


# --- remove-op ---------------------------------------------------------------------------------

def remove_ops(names: list[str], project_dir: Path | None = None, *, force: bool = False,
               autograd: bool = False) -> RemoveOpsResult:
    """Remove kernels that add-op wrote: the kernel file, its test, their records in
    backendgen.json and their lines in the generated registration file, in one transaction.
    `<device>::NAME` removes an operator of the backend (its kernels, autograd, wrapper and test);
    with `autograd`, `aten::OP` removes the autograd override of OP.
    A kernel file edited since add-op wrote it is refused unless `force`, which keeps a copy
    beside it (`<file>.removed-<time>`). Nothing is rebuilt: removing a kernel is often a step
    of an upgrade, when the project does not build yet; `backendgen build` follows."""
    if not names:
        raise UserError("name at least one operator, e.g. aten::cholesky")
    project = Project.find(project_dir) if project_dir is None else Project.load(Path(project_dir))
    return addop.remove(project, names, force=force, autograd=autograd)


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
    unbuilt: bool = False  # the policy was already recorded but not built: this run built it


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
        state = consistency.inspect(project)
        consistency.require_files(project, state)
        db = load_opdb()
        addop.check_torch(project, db)
        op = db.resolve(name)
        table = project.amp_table or {}
        previous = table.get(op.name, "none")
        result = AmpSetResult(project.root, op.qualified, policy, previous)
        registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
        if previous == policy:
            # recorded but not built (a run killed before its build): this run finishes the job
            result.unbuilt = (f"amp {op.name}={policy}" in state.unbuilt if policy != "none"
                              else any(e.startswith(f"amp {op.name}=") for e in state.removed))
            if not (result.unbuilt and build_it):
                return result
        elif policy == "none":
            table.pop(op.name, None)
        else:
            table[op.name] = policy
        project.data["amp"] = dict(sorted(table.items()))
        tx = addop.edit_transaction(project)
        try:
            with rep.step("write"), addop.writes(project.root, "the project was left as it was"):
                if not result.unbuilt:
                    registration.write(project, db, tx)
                    tx.write(project.metadata_path, project.metadata_text())
                    faults.reached("amp:written")
            if build_it:
                with rep.step("build"):
                    build.build(project.root, project.package, project.data["dist_name"])
                result.built = True
                if test_it and policy != "none":
                    with rep.step("test"):
                        build.run_tests(project.root, [f"{project.paths['amp_tests']}::test_policy_takes_effect_under_autocast[{op.name}]"],
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
    status: str  # native | fallback | default | composite | no CPU kernel
    core: bool
    schema: str


def list_ops(pattern: str | None = None, project_dir: Path | None = None, *, required: bool = False) -> list[OpStatus]:
    project = None
    if project_dir is not None:
        project = Project.load(Path(project_dir))
    else:
        try:
            project = Project.find()
        except NotAProjectError:  # a broken backendgen.json is an error, not "outside a project"
            project = None
    db = load_opdb()
    pat = (pattern or "*").removeprefix("aten::")
    if not any(ch in pat for ch in "*?["):
        pat = f"*{pat}*"
    # outside a project: what a new project from the current template has natively
    template = manifest.load() if project is None else None
    rows = []
    for op in db.all():
        if not fnmatch.fnmatchcase(op.name, pat):
            continue
        if required and not op.needs_backend_kernel:
            continue
        if (project.covering(op.qualified) is not None if project is not None
                else template.registering(op.qualified) is not None):
            status = "native"
        elif op.structured_delegate or {"CPU", "CompositeExplicitAutograd"} <= set(op.dispatch_keys):
            status = "fallback"  # registered to the fallback by name (registration.fallback_registrations)
        elif op.composite_implicit:
            status = "composite"
        elif op.lacks_cpu_kernel:
            status = "no CPU kernel"  # the fallback has nothing to run (CUDA-only, sparse-only, ...)
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
        consistency.require_files(project, consistency.inspect(project))  # name a missing file, not a compiler error
        with rep.step("build"):
            outcome = build.build(project.root, project.package, project.data["dist_name"], allow_fast=not full)
        result = BuildResult(project.root, outcome.log, outcome.how, outcome.why_full)
        if test_it:
            with rep.step("test"):
                build.run_tests(project.root)
            result.tested = True
    return result


def build_wheel(project_dir: Path | None = None, *, out: Path | None = None, torch_label: bool = False,
                reporter: Reporter | None = None) -> build.WheelOutcome:
    """A wheel of the project for the installed torch, repaired to a manylinux tag (build.build_wheel),
    in `out` (default: the project's dist/). Its metadata requires exactly that torch."""
    rep = reporter or Reporter()
    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    if "pinned_wheel" not in project.features:
        raise ProjectError(
            f"this project's template ({project.template_version}) does not pin torch in its wheel's metadata; "
            "run `backendgen update` first (docs/upgrading.md)"
        )
    build.check_wheel_tools()  # before the step: a missing tool is one line
    with project.lock():
        with rep.step("wheel"):
            return build.build_wheel(project.root, project.device, Path(out) if out else project.root / "dist",
                                     torch_label=torch_label)


# --- test --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OptInSuite:
    """A part of a generated project's tests that its pytest settings leave out by default (slow:
    each `backendgen test --<option>` runs one after the project's quick suite)."""

    option: str  # the `backendgen test` option, without dashes
    marker: str  # the pytest marker that selects it
    paths_key: str  # where it lives in the project: this key of Project.paths
    what: str  # for messages: "torch.compile tests"
    since: int  # the template version that added it


OPT_IN_SUITES = (
    OptInSuite("compile", "compile", "compile_tests", "torch.compile tests", 6),
    OptInSuite("distributed", "distributed", "distributed_tests", "multi-process tests", 6),
    OptInSuite("models", "models", "model_tests", "model suite", 9),
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
    """Run the project's tests; with `opinfo` also its conformance suite (backendgen.toolchain.conformance);
    then each opt-in suite named in `opt_in` (OPT_IN_SUITES: "compile", "distributed", "models"). Failures
    are in the result (exit_code 1); bad arguments raise UserError."""
    from backendgen.toolchain import conformance
    from backendgen.plumbing.errors import TestFailure

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
        if not (project.root / project.paths[s.paths_key]).exists():
            raise ProjectError(f"{project.root} has no {s.what} ({project.paths[s.paths_key]}, template {s.since} and later); "
                               "docs/upgrading.md says how an older project takes them over")
    result = TestResult(project.root)
    with project.lock():
        if opinfo:  # first: it checks its arguments before anything runs
            with rep.step("conformance"):
                result.suite = conformance.run_suite(
                    project.root, runner=project.paths["conformance_runner"], patterns=patterns, dtypes=dtypes, samples=samples, workers=workers, strict=strict,
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
                    run.log = build.run_tests(project.root, [project.paths[s.paths_key]], name=s.option, marker=s.marker)
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
    from backendgen.commands.check import check_project

    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    if not accept:
        return check_project(project, strict=strict, list_ops=list_ops)
    with project.lock():
        report = check_project(project, strict=strict, list_ops=list_ops)
        if report.exit_code == 0:
            report.accepted = _accept(project, load_opdb())
    return report


def _accept(project: Project, db: OpDB) -> dict:
    before = dict(project.data["torch"])
    updated = []
    for rec in project.ops:
        op = db.get(rec.op)
        if classify(rec.signature, op, schema_unchanged=False) in (Drift.REMOVED, Drift.SIGNATURE_CHANGED):
            raise ProjectError(f"{rec.op} does not fit the installed torch; run backendgen check")  # check said it does
        overloads = [o.qualified for o in db.overloads(op.base)] if rec.overloads else rec.overloads
        if (rec.schema, rec.signature, rec.overloads) != (op.qualified_schema, op.signature, overloads):
            rec.schema, rec.signature, rec.overloads = op.qualified_schema, op.signature, overloads
            project.add_op(rec)
            updated.append(rec.op)
    project.data["torch"] = {"version": db.torch_version, "native_functions_sha256": db.yaml_sha256}
    changed = project.data["torch"] != before or bool(updated)
    # the registration file names operators of the installed torch (registration.fallback_registrations)
    rewrite = registration.needs_rewrite(project, db)
    if changed or rewrite:
        tx = Transaction(project.root)
        try:
            with addop.writes(project.root, "backendgen.json was left as it was"):
                if rewrite:
                    registration.write(project, db, tx)
                tx.write(project.metadata_path, project.metadata_text())
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
    from backendgen.commands import profile as prof

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
    """Carry a project to the current template (backendgen.commands.update): tool-owned files rewritten, the
    others merged 3-way so no hand edit is lost, add-op's kernels brought to the current kernel
    shape. With `torch_signatures`, first re-derive every recorded operator's signature from the
    installed torch and fix the kernels where only types changed; then check.

    One transaction: a failure or an interrupt puts every file back. Conflicts are left with
    markers, listed in the result (exit_code 1) and recorded; nothing is built then. A project in a
    git work tree with uncommitted changes is refused unless `allow_dirty`. `dry_run`: the
    result's diff says what would change, nothing is written."""
    from backendgen.commands import update as upd
    from backendgen.commands.check import check_project
    from backendgen.project.on_disk import METADATA_FILE

    rep = reporter or Reporter()
    project = Project.find() if project_dir is None else Project.load(Path(project_dir))
    consistency.require_files(project, consistency.inspect(project))  # a kernel deleted by hand: say so first
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
            registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
            plan = upd.Plan(project.root)
            old_torch = project.torch_version
            skip = upd.plan_torch(project, db, plan, result) if torch_signatures else set()
            # a project from an earlier state of the current template merges like one from an earlier version
            moves = old < new or upd.earlier_state_of_current(project) is not None
            if moves or torch_signatures:
                with upd.base_template(project, old, result) as old_dir:
                    if moves:
                        upd.plan_template(project, plan, result, old=old, old_dir=old_dir)
                    upd.plan_kernels(project, db, plan, result, old=old, old_dir=old_dir, old_torch=old_torch, skip=skip)
            if moves:
                project.data["template_version"] = str(new)
                project.data["backendgen_version"] = __version__
                project.data["template_state"] = history.current_state()
                upd.refresh_template_records(project, db)
                upd.plan_default_kernels(project, db, plan, result)
            if torch_signatures and not result.unfixable:
                project.data["torch"] = {"version": db.torch_version, "native_functions_sha256": db.yaml_sha256}
                result.torch_recorded = db.torch_version
            if result.conflicts:
                project.data["update"] = {"from": old, "to": new, "conflicts": sorted(set(result.conflicts))}
            else:
                project.data.pop("update", None)
            registration_file = manifest.load().path("registration")  # the current template's: update writes it
            plan.write(registration_file, registration.text(project, db))
            if registration_file in plan.writes:
                result.changes.append(upd.FileChange(registration_file, upd.Action.REWRITTEN))
            plan.write(METADATA_FILE, project.metadata_text())
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
        tx = addop.edit_transaction(project)
        try:
            with rep.step("write"), addop.writes(project.root, "the project was left as it was"):
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
