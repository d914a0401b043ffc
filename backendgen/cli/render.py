"""What each command shows when it is done: one function per result type of `backendgen.api`, each
printing through an `Output` (backendgen.cli.output: only backendgen's own words are styled; paths,
operator names and messages are outside text, shown verbatim).

Loaded when a command runs, never at start-up; the rich pieces a table needs load inside `Output`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backendgen.cli.output import styled

if TYPE_CHECKING:
    from backendgen.cli.output import Output
    from backendgen.commands.addop import AddOpsResult, RemoveOpsResult
    from backendgen.commands.autocast import AmpRow, AmpSetResult
    from backendgen.commands.building import BuildResult
    from backendgen.commands.listing import OpStatus
    from backendgen.commands.new import NewResult
    from backendgen.commands.profile import ProfileResult
    from backendgen.commands.testing import TestResult
    from backendgen.commands.update import UpdateResult
    from backendgen.kinds.findings import CheckReport
    from backendgen.toolchain.build import WheelOutcome
    from backendgen.toolchain.pytorch_tests import Report


def built_state(built: bool, tested: bool, unbuilt: str = "written (not built)") -> str:
    """How far a command got with the project: "built and tested", "built", or `unbuilt`."""
    return "built and tested" if tested else "built" if built else unbuilt


def _notes(notes: list[str], out: Output) -> None:
    for note in notes:
        out.print(f"note: {note}")


def new(res: NewResult, out: Output, *, quiet: bool = False) -> None:
    """`backendgen new`: the project's one line, then (unless quiet) what to do next."""
    _notes(res.notes, out)
    if res.backup:
        out.print(f"the previous project was moved to {res.backup}")
    state = built_state(res.built, res.tested, unbuilt="rendered (not built)")
    with_driver = f" with the {res.driver} driver" if res.driver != "emulator" else ""
    out.print(styled(res.names.device, "bold green"), f" backend{with_driver} {state} in {res.root}")
    if not quiet:
        out.print("next steps:")
        out.print(f"  cd {res.root}")
        if not res.built:
            out.print('  pip install --no-build-isolation -e ".[test]"')
        out.print(f"  python -c \"import torch; print(torch.ones(2, device='{res.names.device}') * 2)\"")
        out.print("  backendgen add-op aten::abs.out      # add a native kernel")
        out.print("  backendgen build --test              # after editing a kernel")
        out.print("  backendgen check                     # after a torch upgrade")


def add_op(res: AddOpsResult, out: Output, *, dry_run: bool = False) -> None:
    """`backendgen add-op`: the files written (or, dry, that would be), then the operators' state."""
    _notes(res.notes, out)
    for op in res.unchanged:
        out.print(f"{op} is already native in this project")
    verb = "would write" if dry_run else "wrote"
    for f in res.files:
        out.print(f"{verb} {f.relative_to(res.root)}")
    if not res.files and not res.added:
        out.print("nothing to do")
    if res.added and not dry_run:
        state = built_state(res.built, res.tested)
        skipped = sum(s.count for s in res.skipped)
        if skipped:
            state += f" ({skipped} of the new tests skipped)"
        out.print(styled(", ".join(res.added), "green"), f": {state}")
        for s in res.skipped:
            out.print(styled("skipped", "yellow"), f" {s.count} in {s.path}: {s.reason}")


def remove_op(res: RemoveOpsResult, out: Output) -> None:
    for f in res.files:
        out.print(f"removed {f.relative_to(res.root)}")
    for b in res.backups:
        out.print(f"kept a copy of your edited file: {b.relative_to(res.root)}")
    out.print(f"{', '.join(res.removed)}: removed; rebuild with `backendgen build`")


def build(res: BuildResult, out: Output) -> None:
    how = res.how + (f": {res.why_full}" if res.why_full else "")
    out.print(styled(built_state(True, res.tested), "green"), f" ({how}); log: {res.log.relative_to(res.root)}")


def wheel(res: WheelOutcome, out: Output) -> None:
    out.print(styled("wheel", "green"), f" {res.wheel} (requires {res.requires_torch or 'torch, unpinned'})")


def test(res: TestResult, out: Output) -> None:
    """`backendgen test`: the conformance suite's summary (with --opinfo), then one line per suite run."""
    if res.suite is not None:
        for text in [res.suite.head, *res.suite.summary, *res.suite.failures, res.suite.tail, *res.suite.notes]:
            out.print(text)
        out.print(f"conformance log: {res.suite.log}")
    if res.tests_failure:
        out.print(f"project tests: {res.tests_failure}")
    else:
        out.print(f"project tests: passed (log: {res.tests_log})")
    for run in res.opt_in:
        out.print(f"{run.suite.what}: {run.failure or 'passed'} (log: {run.log})")


def pytorch_tests(report: Report, out: Output) -> None:
    """`backendgen test --pytorch-tests` without --json (toolchain.pytorch_tests' report)."""
    for text in report.lines():
        out.print(text)
    out.print(f"logs and report.json: {report.out}")


def ops(rows: list[OpStatus], out: Output) -> None:
    colors = {"native": "green", "fallback": "yellow", "default": "cyan", "composite": "dim", "no CPU kernel": "red"}
    out.table(
        ["operator", "status", "core"],
        ([r.name, styled(r.status, colors[r.status]), "core" if r.core else ""] for r in rows),
    )
    out.print(f"{len(rows)} operators")


def amp_list(rows: list[AmpRow], out: Output) -> None:
    out.table(["operator", "policy", "meaning"], ([r.op, r.policy, r.meaning] for r in rows))
    out.print(f"{len(rows)} operators")


def amp_set(res: AmpSetResult, out: Output) -> None:
    if res.previous == res.policy and not res.unbuilt:
        out.print(f"{res.op} is already {res.policy}: nothing to do")
    elif res.unbuilt:
        state = built_state(res.built, res.tested, unbuilt="not built: run backendgen build")
        out.print(f"{res.op} was recorded as {res.policy} but not built ({state})")
    else:
        out.print(f"{res.op}: {res.previous} -> {res.policy} ({built_state(res.built, res.tested)})")


def render_report(report: CheckReport, out: Output) -> None:
    """A check report (`backendgen check`, `update --torch`): findings are outside text."""
    from backendgen.kinds.findings import Area, Severity
    from backendgen.torchdb.drift import Drift

    colors = {Severity.OK: "green", Severity.INFO: "cyan", Severity.WARNING: "yellow", Severity.ERROR: "red"}
    rows = []
    for f in report.findings:
        if f.severity is Severity.OK and f.area is Area.SCHEMA and f.detail.get("kind") is Drift.UNCHANGED:
            continue  # one line per changed op is enough; unchanged ones are counted below
        rows.append([f.area, styled(f.severity, colors[f.severity]), f.subject, f.message])
    unchanged = sum(1 for f in report.of(Area.SCHEMA) if f.detail.get("kind") is Drift.UNCHANGED)
    if unchanged:
        rows.append(["schema", styled("ok", "green"), f"{unchanged} operators", "schemas unchanged"])
    out.table(["area", "", "subject", "finding"], rows)
    if "native_ops" in report.coverage:
        out.print(f"\nnative ({len(report.coverage['native_ops'])}): " + ", ".join(report.coverage["native_ops"]))
        out.print(
            f"\nCPU fallback ({len(report.coverage['fallback_ops'])}): " + ", ".join(report.coverage["fallback_ops"])
        )
        if report.coverage.get("no_cpu_kernel_ops"):
            out.print(
                f"\nno CPU kernel ({len(report.coverage['no_cpu_kernel_ops'])}): "
                + ", ".join(report.coverage["no_cpu_kernel_ops"])
            )
    out.print("\n", styled(report.verdict, "bold " + ("red" if report.exit_code else "green")))


def check(report: CheckReport, out: Output, *, accept: bool = False) -> None:
    """`backendgen check`: the report, then with --accept what was recorded (or why not)."""
    render_report(report, out)
    if not accept:
        return
    acc = report.accepted
    if acc is None:
        out.print("not accepted: fix the errors above first (docs/upgrading.md)")
    elif not acc["changed"]:
        out.print(f"nothing to accept: backendgen.json already targets torch {acc['to']}")
    else:
        names = f"; recorded the new schemas of {', '.join(acc['updated_ops'])}" if acc["updated_ops"] else ""
        out.print(f"accepted: backendgen.json now targets torch {acc['to']} (was {acc['from']}){names}")
        if acc.get("rebuild"):
            out.print("rewrote csrc/aten/ops/generated (the registration) for this torch: rebuild (backendgen build)")


def update(res: UpdateResult, out: Output) -> None:
    """`backendgen update`: unresolved markers of an earlier update alone; else the diff (dry run),
    the files, the notes, --torch's fixes, the outcome, and --torch's check report."""
    from backendgen.commands.update import Fix

    if res.unresolved:
        out.print(
            styled("unresolved conflicts", "red"), " from the last update (resolve the markers, then run update again):"
        )
        for rel in res.unresolved:
            out.print(f"  {rel}")
        return
    if res.dry_run:
        for text in res.diff.splitlines():
            out.print(text)
    verb = "would be " if res.dry_run else ""
    for c in res.changes:
        out.print(f"{c.action:<11} {c.path}" + (f" ({c.note})" if c.note else ""))
    _notes(res.notes, out)
    for fix in res.torch or []:
        more = f"; close matches: {', '.join(fix.close_matches)}" if fix.close_matches else ""
        text = f"{fix.op} ({fix.file}): {fix.detail}{more}"
        if fix.action is Fix.UNFIXABLE:
            out.print(styled("cannot fix", "red"), f" {text}")
        else:
            out.print(f"{fix.action}: {text}")
    if res.torch_recorded and not res.dry_run:
        out.print(f"backendgen.json now targets torch {res.torch_recorded}")
    if res.from_version == res.to_version and not res.changes:
        out.print(f"nothing to do: the project is on template {res.to_version}")
    elif res.conflicts:
        out.print(
            styled(f"{len(res.conflicts)} conflict(s)", "red"),
            f" {verb}left with markers; resolve them, then run backendgen update again (it builds and tests):",
        )
        for rel in res.conflicts:
            out.print(f"  {rel}")
    elif not res.dry_run:
        out.print(
            styled(f"template {res.from_version} -> {res.to_version}", "green"),
            f": {built_state(res.built, res.tested)}",
        )
    if res.check is not None:
        render_report(res.check, out)


def profile(res: ProfileResult, out: Output) -> None:
    """The profile as a table; operator names and paths are outside text."""
    _notes(res.notes, out)
    if not res.collected:
        return
    if not res.entries:
        out.print(f"no operator ran on the CPU fallback ({res.script} ran {res.seconds:.2f} s)")
        return
    total = res.fallback_seconds
    spent = (
        f"{total:.3f} s, {100 * total / res.seconds:.1f}% of the {res.seconds:.2f} s the script ran"
        if total is not None and res.seconds
        else f"the script ran {res.seconds:.2f} s"
    )
    calls = sum(e.calls for e in res.entries)
    out.print(f"CPU fallback: {len(res.entries)} operators, {calls} calls ({spent}):")
    rows = [("calls", "seconds", "share", "operator", "backendgen add-op")]
    for e in res.entries:
        share = res.share(e)
        make_native = e.target if e.reason is None else f"- ({e.reason})"
        rows.append(
            (
                str(e.calls),
                "-" if e.seconds is None else f"{e.seconds:.4f}",
                "-" if share is None else f"{100 * share:.1f}%",
                " + ".join(e.names),
                make_native,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        out.print(
            "  "
            + "  ".join(
                [r[0].rjust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3].ljust(widths[3]), r[4]]
            ).rstrip()
        )
    if res.command:
        out.print("")
        out.print("to make them native:")
        out.print(f"  {res.command}")
