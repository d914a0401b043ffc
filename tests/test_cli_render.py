"""What the CLI's renderers (backendgen.cli.render) print for hand-made results: nothing is built."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from backendgen.cli import render
from backendgen.cli.output import Output
from backendgen.commands.addop import AddOpsResult
from backendgen.commands.autocast import AmpSetResult
from backendgen.commands.new import NewResult
from backendgen.commands.update import Action, FileChange, UpdateResult
from backendgen.kinds.findings import Area, CheckReport, Severity
from backendgen.project import naming
from backendgen.toolchain.build import Skipped

ROOT = Path("/tmp/torch-mychip")


def _output() -> tuple[Output, io.StringIO]:
    out = Output()
    text = io.StringIO()
    out.console = Console(file=text, markup=False, emoji=False, highlight=False, soft_wrap=True, width=100_000)
    return out, text


def _lines(show, *args, **kwargs) -> list[str]:
    out, text = _output()
    show(*args, out, **kwargs)
    return text.getvalue().splitlines()


@pytest.mark.parametrize(
    ("built", "tested", "state"),
    [(True, True, "built and tested"), (True, False, "built"), (False, False, "rendered (not built)")],
)
def test_new_says_how_far_it_got(built, tested, state):
    res = NewResult(ROOT, naming.derive("mychip"), ops=[], built=built, tested=tested)
    assert _lines(render.new, res, quiet=True) == [f"mychip backend {state} in {ROOT}"]


def test_new_names_a_driver_other_than_the_emulator_and_the_next_steps():
    res = NewResult(ROOT, naming.derive("mychip"), ops=[], built=False, tested=False, driver="minimal")
    lines = _lines(render.new, res)
    assert lines[0] == f"mychip backend with the minimal driver rendered (not built) in {ROOT}"
    assert lines[1:4] == ["next steps:", f"  cd {ROOT}", '  pip install --no-build-isolation -e ".[test]"']


@pytest.mark.parametrize(
    ("built", "tested", "state"),
    [(True, True, "built and tested"), (True, False, "built"), (False, False, "written (not built)")],
)
def test_add_op_states_what_became_of_the_operators(built, tested, state):
    abs_out = ROOT / "csrc/aten/ops/abs.cpp"
    res = AddOpsResult(ROOT, added=["aten::abs.out"], files=[abs_out], built=built, tested=tested)
    assert _lines(render.add_op, res) == ["wrote csrc/aten/ops/abs.cpp", f"aten::abs.out: {state}"]


def test_add_op_counts_the_skipped_tests_and_a_dry_run_states_nothing():
    res = AddOpsResult(
        ROOT,
        added=["aten::foo"],
        files=[ROOT / "tests/ops/test_foo.py"],
        built=True,
        tested=True,
        skipped=[Skipped(1, "tests/ops/test_foo.py", "no sample")],
    )
    assert _lines(render.add_op, res) == [
        "wrote tests/ops/test_foo.py",
        "aten::foo: built and tested (1 of the new tests skipped)",
        "skipped 1 in tests/ops/test_foo.py: no sample",
    ]
    assert _lines(render.add_op, res, dry_run=True) == ["would write tests/ops/test_foo.py"]


@pytest.mark.parametrize(
    ("built", "tested", "state"),
    [(True, True, "built and tested"), (True, False, "built"), (False, False, "written (not built)")],
)
def test_update_states_the_template_step(built, tested, state):
    res = UpdateResult(ROOT, 11, 12, changes=[FileChange("setup.py", Action.MERGED)], built=built, tested=tested)
    assert _lines(render.update, res) == ["merged      setup.py", f"template 11 -> 12: {state}"]


def test_update_lists_an_earlier_updates_conflicts_alone():
    res = UpdateResult(ROOT, 11, 12, unresolved=["setup.py"], built=True, tested=True)
    assert _lines(render.update, res) == [
        "unresolved conflicts from the last update (resolve the markers, then run update again):",
        "  setup.py",
    ]
    assert res.exit_code == 1


def test_amp_set_unbuilt_has_its_own_last_rung():
    res = AmpSetResult(ROOT, "aten::mm", "fp32", previous="fp32", unbuilt=True)
    state = "not built: run backendgen build"
    assert _lines(render.amp_set, res) == [f"aten::mm was recorded as fp32 but not built ({state})"]
    res = AmpSetResult(ROOT, "aten::mm", "fp32", previous="none", built=True, tested=True)
    assert _lines(render.amp_set, res) == ["aten::mm: none -> fp32 (built and tested)"]


def test_check_accept_lines_follow_the_report():
    report = CheckReport(project=str(ROOT), strict=False)
    report.add(Area.VERSIONS, Severity.OK, "torch", "2.13.0")
    report.accepted = {"changed": True, "from": "2.12.0", "to": "2.13.0", "updated_ops": [], "rebuild": False}
    lines = _lines(render.check, report, accept=True)
    assert lines[-2:] == ["ok", "accepted: backendgen.json now targets torch 2.13.0 (was 2.12.0)"]
    assert _lines(render.check, report)[-1] == "ok"
