"""`backendgen check`: is a generated backend still right for the installed torch?

Five areas, one finding per line:
- versions   the torch the project was generated for against the installed one, and whether the
             installed one is a tested release (backendgen/torchdb/support.py);
- schema     every registered operator's schema against the installed torch (canonical strings
             from `torch._C.parse_schema`; never `FunctionSchema ==`, which equates SymInt and int),
             short-circuited when `native_functions.yaml` has the recorded hash;
- api        the C++ and Python extension points the template relies on (each integration point's
             in the template's manifest, backendgen/project/manifest.py), every attribute of the
             device module that the installed torch's own Python reads (backendgen/project/devmodule.py),
             and the port API: a file outside csrc/driver that includes more of the driver than
             driver.h (backendgen/project/contract.py);
- extension  the built library, loaded in a subprocess (a bad static registration aborts the
             process that loads it): not built, built for another torch, dangling or missing kernels;
- coverage   how many of the operators that need a backend kernel are native.

Everything that needs torch runs in ONE subprocess (`backendgen.programs.probe`), which costs about
one `import torch`; it is started first, and the operator database loads while it runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from backendgen import __version__
from backendgen.kinds import registration, registry
from backendgen.kinds.findings import Area, CheckReport, Kind, Severity
from backendgen.kinds.kind import keyed
from backendgen.plumbing import interrupt
from backendgen.plumbing.environment import installed_torch, subprocess_env
from backendgen.plumbing.errors import EnvironmentProblem, ProjectError
from backendgen.project import contract, devmodule, manifest
from backendgen.project.on_disk import Project
from backendgen.project.record import TorchTarget
from backendgen.torchdb import support
from backendgen.torchdb.drift import Drift, classify
from backendgen.torchdb.opdb import OpDB, load_opdb

PROBE_APIS = ("torch._C._dispatch_find_dangling_impls",)


def python_apis() -> list[str]:
    """The dotted torch names the probe looks up: the template's (per integration point) and check's own."""
    names = [n for point in manifest.load().integration_points for n in point.python_apis]
    return list(dict.fromkeys([*names, *PROBE_APIS]))


def _expected_keys(project: Project) -> dict[str, list[str]]:
    """The dispatch keys each operator of each kind and each autocast entry must have a kernel for;
    for a project on the current template, also each registration of its integration points (the
    manifest's `registers`; an operator a point defines has its catch-all kernel)."""
    keys: dict[str, list[str]] = {}
    tpl = manifest.load()
    if project.template_version == tpl.template_version:
        for point in tpl.integration_points:
            for key, ops in point.registers.items():
                for op in ops:
                    if not op.startswith("_::"):  # a fallback has no operator to look up
                        keys.setdefault(op, []).append(key)
            for op in point.defines:
                keys.setdefault(op.replace("{package}", project.package), []).append("CompositeImplicitAutograd")
    for kind in registry.KINDS:
        for op, wanted in kind.expected_keys(project).items():
            keys.setdefault(op, []).extend(wanted)
    for name in project.amp_table or {}:
        keys.setdefault(f"aten::{name}", []).append("AutocastPrivateUse1")
    return keys


def _check_amp(report: CheckReport, project: Project, db: OpDB, probed: dict) -> None:
    """The autocast table's operators still exist in the installed torch; the library registers every
    kernel each operator of each kind and each autocast entry needs (_expected_keys)."""
    for name in project.amp_table or {}:
        if db.get(name) is None:
            report.add(
                Area.SCHEMA,
                Severity.ERROR,
                f"aten::{name}",
                f"in the autocast table but removed from torch {db.torch_version}: backendgen amp set {name} none",
                kind=Drift.REMOVED,
            )
    for op, keys in (keyed(probed) or {}).items():
        missing = [k for k, has in keys.items() if not has]
        if missing:
            report.add(
                Area.EXTENSION,
                Severity.ERROR,
                op,
                f"the library registers no {', '.join(missing)} kernel for it: rebuild",
                kind=Kind.MISSING_KERNEL,
            )


def device_module_reads() -> dict[str, list[str]]:
    """What the installed torch's Python reads from a device module, less what the manifest says
    concerns no PrivateUse1 device (backendgen/project/devmodule.py)."""
    torch = installed_torch()
    if torch.torch_dir is None or torch.version is None:
        return {}
    return devmodule.required(
        devmodule.torch_reads(torch.torch_dir, torch.version), manifest.load().device_module_not_needed
    )


def _start_probe(project: Project, schemas: dict[str, str], device_module: list[str]) -> subprocess.Popen:
    """Start the subprocess that needs torch (about one `import torch`); `_probe_results` collects it."""
    req = {
        "package": project.package,
        "py_apis": python_apis(),
        "schemas": schemas,
        "ops": [rec.op for rec in project.ops],
        "keys": _expected_keys(project),
        "device_module": device_module,
    }
    return interrupt.popen(
        [sys.executable, "-m", "backendgen.programs.probe", json.dumps(req)],
        cwd=project.root,
        env=subprocess_env(autoload="0", pythonpath=project.root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _probe_results(proc: subprocess.Popen) -> tuple[dict, str, int]:
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        interrupt.stop(proc)
        stdout, stderr = proc.communicate()
    except BaseException:  # Ctrl-C: the probe is in a process group of its own
        interrupt.stop(proc)
        raise
    results: dict = {}
    for line in stdout.splitlines():
        try:
            results.update(json.loads(line))
        except ValueError:
            continue
    return results, stderr, proc.returncode


def _check_versions(report: CheckReport, project: Project, db: OpDB) -> None:
    recorded = project.torch_version
    if recorded == db.torch_version:
        report.add(Area.VERSIONS, Severity.OK, "torch", f"generated for and running on torch {recorded}")
    else:
        report.add(
            Area.VERSIONS,
            Severity.WARNING,
            "torch",
            f"generated for torch {recorded}, installed {db.torch_version}: fix the findings below, rebuild, "
            "then backendgen check --accept",
            recorded=recorded,
            installed=db.torch_version,
        )
    try:
        policy = support.torch_support(db.torch_version)
    except EnvironmentProblem as e:
        report.add(Area.VERSIONS, Severity.ERROR, "support", str(e), kind=Kind.TOO_OLD)
    else:
        if policy.tested:
            report.add(
                Area.VERSIONS, Severity.OK, "support", f"torch {db.torch_version} is a tested release", kind=Kind.TESTED
            )
        else:
            report.add(
                Area.VERSIONS,
                Severity.INFO,
                "support",
                f"torch {db.torch_version} is not a tested release (tested: {', '.join(support.TESTED)}): "
                "the findings below say what differs from the torch the project was made for",
                kind=Kind.UNTESTED,
            )
    made_with = project.record.backendgen_version or "?"
    sev = Severity.OK if made_with == __version__ else Severity.INFO
    report.add(
        Area.VERSIONS,
        sev,
        "backendgen",
        f"generated by backendgen {made_with} (template {project.record.template_version or '?'}), "
        f"this is {__version__}",
    )


_NOT_A_MESSAGE = re.compile(r"\s*(frame #\d+|<omitting python frames>|Exception raised from )")


def crash_summary(stderr: str) -> str:
    """What a process that died loading the extension said, without the C++ stack: the error's
    first line (after c10's `what():`) and its last three lines, e.g. "Mismatch in kernel C++
    signatures | kernel 2: ... | dispatch key: PrivateUse1 | registered at .../my_op.cpp:6"."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not _NOT_A_MESSAGE.match(ln)]
    head = None
    for i, ln in enumerate(lines):
        if ln.startswith("what():"):
            rest = ln[len("what():") :].strip()
            head = rest or (lines[i + 1] if i + 1 < len(lines) else None)
            break
    tail = lines[-3:]
    if head is not None and head not in tail:
        tail = [head, *tail]
    return " | ".join(tail)


def _check_apis(report: CheckReport, project: Project, db: OpDB, probed: dict | None) -> None:
    """The torch APIs each integration point of the manifest uses: C++ names in their headers and
    torch source text read as files (importing Dynamo and Inductor would cost a second), Python
    names from the probe. A missing one is an error, or a warning for an optional point (the
    device works without it), which is checked only if the project has it."""
    pkg = db.info.torchgen_dir.parent / "torch"
    inc = pkg / "include"
    probed_py = (probed or {}).get("py_apis")
    texts: dict[Path, str] = {}

    def text(path: Path) -> str:
        if path not in texts:
            texts[path] = path.read_text(errors="replace") if path.is_file() else ""
        return texts[path]

    missing: dict[str, tuple[bool, str]] = {}  # subject -> (optional, who uses it)
    counts = {"cpp": 0, "py": 0}
    for point in manifest.load().integration_points:
        where = [p.replace("{package}", project.package) for p in point.paths]
        if point.optional and not any((project.root / w.split("<")[0]).exists() for w in where):
            continue
        user = f"the template's {point.name} ({', '.join(where)})"
        found = []
        for header, names in point.cpp_apis.items():
            counts["cpp"] += len(names)
            body = text(inc / header)
            found += [(f"{header} (missing header)" if not body else f"{header}: {n}") for n in names if n not in body]
        for source, names in point.python_sources.items():
            counts["py"] += len(names)
            body = text(pkg / source)
            found += [
                (f"torch/{source} (missing)" if not body else f"torch/{source}: {n}") for n in names if n not in body
            ]
        counts["py"] += len(point.python_apis)
        if probed_py is not None:
            found += [n for n in point.python_apis if not probed_py.get(n, True)]
        for subject in found:
            if subject not in missing or not point.optional:
                missing[subject] = (point.optional, user)
    if probed_py is not None:
        for name in PROBE_APIS:
            if not probed_py.get(name, True):
                missing[name] = (False, "backendgen check")
    for subject in sorted(missing):
        optional, user = missing[subject]
        report.add(
            Area.API,
            Severity.WARNING if optional else Severity.ERROR,
            subject,
            f"not found in the installed torch: {user} must be ported",
        )
    if not missing:
        report.add(
            Area.API,
            Severity.OK,
            "extension points",
            f"all {counts['cpp']} C++ and {counts['py']} Python extension points present",
        )


def _check_driver_includes(report: CheckReport, project: Project) -> None:
    """Nothing outside csrc/driver includes more of the driver than driver.h, the port API
    (contract.driver_includes): a warning, the backend still builds, but its port is not one file."""
    for found in contract.driver_includes(contract.project_sources(project.root)):
        report.add(
            Area.API,
            Severity.WARNING,
            found.path,
            f"{found.message}: reach the device through driver.h (its optional capabilities, driver::has)",
            kind=Kind.DRIVER_INCLUDE,
            include=found.target,
        )


def _check_device_module(report: CheckReport, project: Project, reads: dict[str, list[str]], probed: dict) -> None:
    """Each attribute torch's own Python reads from torch.<device> (a read with a silent default
    turns into a wrong result, e.g. checkpointing without `_initialized`) must be there."""
    present = probed.get("device_module")
    if present is None or not reads:
        return  # the backend did not load: the extension area says why
    missing = [name for name in reads if not present.get(name, True)]
    for name in missing:
        where = ", ".join(reads[name][:3]) + (", ..." if len(reads[name]) > 3 else "")
        report.add(
            Area.API,
            Severity.ERROR,
            f"torch.{project.device}.{name}",
            f"torch reads it ({where}) and the device module lacks it: add it to {project.package}/device_module.py "
            '(docs/troubleshooting.md, "The device module\'s contract")',
            kind=Kind.DEVICE_MODULE,
            where=reads[name],
        )
    if not missing:
        report.add(
            Area.API,
            Severity.OK,
            f"torch.{project.device}",
            f"answers all {len(reads)} attributes torch's own Python reads from a device module",
        )


def _check_extension(report: CheckReport, project: Project, probed: dict, stderr: str, returncode: int) -> set[str]:
    pkg_dir = project.root / project.package
    built = sorted(pkg_dir.glob("_C*.so"))
    if not built:
        report.add(Area.EXTENSION, Severity.ERROR, project.package, "not built: pip install --no-build-isolation -e .")
        return set()
    sources = [p for p in (project.root / "csrc").rglob("*") if p.suffix in (".cpp", ".h")]
    newest = max((p.stat().st_mtime for p in sources), default=0)
    if newest > built[0].stat().st_mtime:
        report.add(Area.EXTENSION, Severity.WARNING, built[0].name, "sources changed since the last build: rebuild")
    load = probed.get("load")
    if load is None:
        _probe_failed(report, project, stderr, returncode)
        return set()
    if not load["ok"]:
        _load_failed(report, project, load)
        return set()
    report.add(Area.EXTENSION, Severity.OK, project.package, f"loads into torch as '{load['backend_name']}'")
    _check_kernels(report, project, load)
    return set(load["registered"])


def _probe_failed(report: CheckReport, project: Project, stderr: str, returncode: int) -> None:
    """The probe said nothing of loading the library: it crashed (a signal), or failed before."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name
        tail = crash_summary(stderr)
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            project.package,
            f"loading it killed the process ({sig}): the library is corrupt or a static registration "
            f"failed — rebuild{'; ' + tail if tail else ''}",
            kind=Kind.CRASH,
        )
    else:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        report.add(Area.EXTENSION, Severity.ERROR, project.package, f"could not be probed: {tail}", kind=Kind.PROBE)


def _load_failed(report: CheckReport, project: Project, load: dict) -> None:
    """The library did not load: built for another torch (its own check, or an undefined symbol), or broken."""
    msg = load["message"]
    if load["type"] == "TorchMismatch":  # the package's own check (template 10 on): built for another torch
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            project.package,
            f"{msg.splitlines()[0]} (a user of its wheel: install the wheel built for this torch)",
            kind=Kind.TORCH_MISMATCH,
        )
    elif "undefined symbol" in msg:
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            project.package,
            f"built against another torch (undefined symbol): rebuild with pip install --no-build-isolation -e . "
            f"[{msg.splitlines()[0][:200]}]",
            kind=Kind.ABI,
        )
    else:
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            project.package,
            f"fails to load ({load['type']}: {msg.splitlines()[0][:200] if msg else ''}): rebuild",
            kind=Kind.LOAD,
        )


def _check_kernels(report: CheckReport, project: Project, load: dict) -> None:
    """The loaded library's kernels: none for an operator torch lacks, one for every recorded operator,
    add-op's registered where the project registers them."""
    for d in load["dangling"]:
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            d.splitlines()[0][:200],
            "kernel registered for an operator that does not exist in this torch",
            kind=Kind.DANGLING,
        )
    for op, k in load["kernels"].items():
        rec = project.find_op(op)
        if not k["has"]:
            report.add(
                Area.EXTENSION,
                Severity.ERROR,
                op,
                "recorded in backendgen.json but the library registers no kernel for it: rebuild",
                kind=Kind.MISSING_KERNEL,
            )
        elif rec is not None and rec.origin == "add-op" and not _registered_here(k["line"], project, rec.source):
            report.add(
                Area.EXTENSION,
                Severity.WARNING,
                op,
                f"its PrivateUse1 kernel is not registered by {' or '.join(registration.paths(project))} or "
                f"{rec.source}: {k['line'][:160]}",
            )


_REGISTERED_AT = re.compile(r" registered at (.+?):\d+")


def _registered_here(dispatch_line: str, project: Project, source: str) -> bool:
    """Whether a dispatch-table line names the project's registration file (or the kernel's own file,
    where a team moved the registration) as where the kernel was registered."""
    m = _REGISTERED_AT.search(dispatch_line)
    if m is None:
        return False
    at = Path(m.group(1))
    if not at.is_absolute():
        # built through ccache with the project as its base directory (build.py): the path is relative
        # to the compiler's directory, e.g. ../unity/../../csrc/...; its part inside the project counts
        parts = os.path.normpath(at).split(os.sep)
        while parts and parts[0] == "..":
            parts.pop(0)
        return "/".join(parts) in {*registration.paths(project), source}
    return at.resolve() in {(project.root / f).resolve() for f in (*registration.paths(project), source)}


def _check_coverage(report: CheckReport, project: Project, db: OpDB, registered: set[str], list_ops: bool) -> None:
    if not registered:
        registered = {rec.op for rec in project.ops}
    required = db.required()
    native = [op for op in required if op.qualified in registered]
    fallback = [op for op in required if op.qualified not in registered and not op.lacks_cpu_kernel]
    no_cpu = [op for op in required if op.qualified not in registered and op.lacks_cpu_kernel]
    report.coverage = {
        "required": len(required),
        "native": len(native),
        "fallback": len(fallback),
        "no_cpu_kernel": len(no_cpu),
    }
    report.add(
        Area.COVERAGE,
        Severity.INFO,
        "operators",
        f"{len(native)} of the {len(required)} operators that need a backend kernel are native; "
        f"{len(fallback)} run through the CPU fallback; {len(no_cpu)} have no CPU kernel for it to run "
        "(CUDA-only and the like)",
        **report.coverage,
    )
    if list_ops:

        def order(ops):
            return [o.qualified for o in sorted(ops, key=lambda o: ("core" not in o.tags, o.name))]

        report.coverage["native_ops"] = order(native)
        report.coverage["fallback_ops"] = order(fallback)
        report.coverage["no_cpu_kernel_ops"] = order(no_cpu)


def _check_consistency(report: CheckReport, project: Project) -> None:
    """The record against the files and the built library (backendgen.commands.consistency)."""
    from backendgen.commands import consistency

    state = consistency.inspect(project)
    for rel in state.missing:
        why = "every build runs it" if rel in consistency.BUILD_FILES else "recorded in backendgen.json"
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            rel,
            f"missing ({why}): restore it, e.g. git checkout -- {rel}",
            kind=Kind.MISSING_FILE,
        )
    for entry in state.unbuilt:
        report.add(
            Area.EXTENSION,
            Severity.ERROR,
            entry,
            "recorded in backendgen.json but not in the library's last build: backendgen build (or rerun its add-op)",
            kind=Kind.UNBUILT,
        )
    if state.removed:
        report.add(
            Area.EXTENSION,
            Severity.WARNING,
            ", ".join(state.removed[:5]),
            "built into the library but no longer recorded: rebuild (backendgen build)",
            kind=Kind.UNBUILT,
        )


def check_project(
    project: Project, *, strict: bool = False, list_ops: bool = False, opdb: OpDB | None = None
) -> CheckReport:
    # The probe (one `import torch`) is most of a check: it starts first, with every recorded schema
    # (the live ones are looked up only for those; cheap), and torch's files are read meanwhile.
    reads = device_module_reads()
    probe = _start_probe(project, {rec.op: rec.schema for rec in project.ops}, sorted(reads))
    try:
        db = opdb or load_opdb()
    except BaseException:
        interrupt.stop(probe)
        raise
    probed, stderr, returncode = _probe_results(probe)
    report = CheckReport(project=str(project.root), strict=strict)
    _check_versions(report, project, db)
    for kind in registry.KINDS:  # what each kind of operator the project records says of the installed torch
        kind.check(report, project, db, probed)
    _check_apis(report, project, db, probed)
    _check_driver_includes(report, project)
    registered = _check_extension(report, project, probed, stderr, returncode)
    _check_consistency(report, project)
    _check_device_module(report, project, reads, probed)
    _check_amp(report, project, db, probed)
    _check_coverage(report, project, db, registered, list_ops)
    return report


# --- the command -------------------------------------------------------------------------------


def check(project_dir: Path | None = None, *, strict: bool = False, list_ops: bool = False, accept: bool = False):
    """Check the project against the installed torch. With `accept`, a check without errors (and
    without warnings under `strict`) then records that the project targets the installed torch:
    its version, its native_functions.yaml hash, and the schemas and C++ signatures of the
    operators that changed only in names (report.accepted says what; add-op works again)."""
    from backendgen.commands import transaction

    project = Project.of(project_dir)
    if not accept:
        return check_project(project, strict=strict, list_ops=list_ops)
    with transaction.change(project, require_files=False, rebuilds=False) as change:
        report = check_project(project, strict=strict, list_ops=list_ops)
        if report.exit_code == 0:
            report.accepted = _accept(change, load_opdb())
    return report


def _accept(change, db: OpDB) -> dict:
    """Record the installed torch in backendgen.json (check --accept), and rewrite the registration file for it."""
    project = change.project
    before = project.record.torch.to_json()
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
    project.record.torch = TorchTarget(version=db.torch_version, native_functions_sha256=db.yaml_sha256)
    changed = project.record.torch.to_json() != before or bool(updated)
    # the registration file names operators of the installed torch (registration.fallback_registrations)
    rewrite = registration.needs_rewrite(project, db)
    if changed or rewrite:
        with change.writing() as tx:
            if rewrite:
                registration.write(project, db, tx)
            change.save_record()
    return {
        "changed": changed or rewrite,
        "from": before["version"],
        "to": db.torch_version,
        "updated_ops": sorted(updated),
        "rebuild": rewrite,
    }
