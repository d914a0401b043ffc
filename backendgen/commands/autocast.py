"""`backendgen amp list|set`: the project's autocast table, and setting one operator's policy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from backendgen.commands import addop, transaction
from backendgen.kinds import registration
from backendgen.plumbing import faults
from backendgen.plumbing.progress import Reporter
from backendgen.project import amp
from backendgen.project.on_disk import Project
from backendgen.torchdb.opdb import load_opdb


@dataclass
class AmpRow:
    op: str  # "aten::mm"
    policy: str
    meaning: str


def amp_list(project_dir: Path | None = None) -> list[AmpRow]:
    """The project's autocast table."""
    project = Project.of(project_dir)
    amp.check_supported(project.template_version)
    return [
        AmpRow(f"aten::{name}", policy, amp.POLICIES[policy]) for name, policy in amp.entries(project.amp_table or {})
    ]


@dataclass
class AmpSetResult:
    root: Path
    op: str
    policy: str
    previous: str  # "none" when the operator was not in the table
    built: bool = False
    tested: bool = False
    unbuilt: bool = False  # the policy was already recorded but not built: this run built it


def amp_set(
    name: str,
    policy: str,
    project_dir: Path | None = None,
    *,
    build_it: bool = True,
    test_it: bool = True,
    reporter: Reporter | None = None,
) -> AmpSetResult:
    """Set the autocast policy of one operator ("none" takes it out of the table), rewrite the
    registration file, rebuild and run the table's test for that operator; on failure the project is
    left as it was."""
    rep = reporter or Reporter()
    project = Project.of(project_dir)
    amp.check_supported(project.template_version)
    policy = amp.check_policy(policy)
    with transaction.change(project) as change:
        db = load_opdb()
        addop.check_torch(project, db)
        op = db.resolve(name)
        table = project.amp_table or {}
        previous = table.get(op.name, "none")
        result = AmpSetResult(project.root, op.qualified, policy, previous)
        registration.needs_rewrite(project, db)  # refuses a registration file edited by hand
        if previous == policy:
            # recorded but not built (a run killed before its build): this run finishes the job
            result.unbuilt = (
                f"amp {op.name}={policy}" in change.state.unbuilt
                if policy != "none"
                else any(e.startswith(f"amp {op.name}=") for e in change.state.removed)
            )
            if not (result.unbuilt and build_it):
                return result
        elif policy == "none":
            table.pop(op.name, None)
        else:
            table[op.name] = policy
        project.record.amp = dict(sorted(table.items()))
        with change.writing(rep) as tx:
            if not result.unbuilt:
                registration.write(project, db, tx)
                change.save_record()
                faults.reached("amp:written")
        if build_it:
            tests = (
                [f"{project.paths['amp_tests']}::test_policy_takes_effect_under_autocast[{op.name}]"]
                if policy != "none"
                else []
            )
            change.build_and_test(rep, tests=tests, test=test_it, name="amp-test")
            result.built, result.tested = change.built, change.tested
    return result
