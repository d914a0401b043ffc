"""add-op and ops on operators the CPU fallback cannot run (no CPU kernel, e.g. the CUDA-only fused
RNN cells), and what add-op says about the generated tests it skipped. Fast: nothing is built."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_cli

from backendgen import api
from backendgen.toolchain import build

FUSED_CELLS = [
    "aten::_thnn_fused_lstm_cell",
    "aten::_thnn_fused_lstm_cell_backward_impl",
    "aten::_thnn_fused_gru_cell",
    "aten::_thnn_fused_gru_cell_backward",
]
SYNC_BATCH_NORM = [
    "aten::batch_norm_stats",
    "aten::batch_norm_gather_stats",
    "aten::batch_norm_gather_stats_with_counts",
    "aten::batch_norm_elemt",
    "aten::batch_norm_elemt.out",
    "aten::batch_norm_backward_reduce",
    "aten::batch_norm_backward_elemt",
]


def _snapshot(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".backendgen.lock"}


@pytest.fixture
def project(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    return root


def _ops_status(rows):
    return {r.name: r.status for r in rows}


def test_add_op_refuses_an_operator_without_a_cpu_kernel(project):
    before = _snapshot(project)
    out = run_cli("add-op", "aten::cudnn_convolution", "--no-build", cwd=project)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert "aten::cudnn_convolution has no CPU kernel" in line and "CUDA only" in line and "by hand" in line
    assert "backendgen update" not in line  # the template does not implement it
    assert _snapshot(project) == before


def test_add_op_of_a_fused_cell_says_the_template_implements_it(project):
    before = _snapshot(project)
    out = run_cli("add-op", "aten::_thnn_fused_lstm_cell", "_thnn_fused_gru_cell_backward", "--no-build", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "aten::_thnn_fused_lstm_cell is already native in this project" in out.stdout
    assert "aten::_thnn_fused_gru_cell_backward is native in the template: csrc/aten/rnn.cpp" in out.stdout
    assert "nothing to do" in out.stdout
    assert _snapshot(project) == before


def test_add_op_of_the_out_form_of_a_fused_cell(project):
    """The autogen'd out= overload runs through its composite kernel, which calls the native functional."""
    before = _snapshot(project)
    out = run_cli("add-op", "aten::_thnn_fused_gru_cell.out", "--no-build", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "runs on the device through its composite kernel, which calls aten::_thnn_fused_gru_cell" in out.stdout
    assert _snapshot(project) == before


def test_a_project_without_the_native_cells_is_told_to_update(project):
    """A project from a template without csrc/aten/rnn.cpp: add-op refuses and names the update."""
    meta = json.loads((project / "backendgen.json").read_text())
    meta["ops"] = [d for d in meta["ops"] if d["op"] not in FUSED_CELLS]
    (project / "backendgen.json").write_text(json.dumps(meta, indent=2) + "\n")
    before = _snapshot(project)
    for name in ("_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell.out"):
        out = run_cli("add-op", name, "--no-build", cwd=project)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "has no CPU kernel" in out.stderr and "csrc/aten/rnn.cpp" in out.stderr, out.stderr
        assert "run backendgen update" in out.stderr
    assert _snapshot(project) == before
    rows = _ops_status(api.list_ops("_thnn_fused", project))
    assert {rows[n] for n in FUSED_CELLS} == {"no CPU kernel"}


def test_ops_lists_the_fused_cells_native_not_fallback(project, tmp_path, monkeypatch):
    rows = _ops_status(api.list_ops("_thnn_fused", project))
    assert {rows[n] for n in FUSED_CELLS} == {"native"}
    assert rows["aten::_thnn_fused_lstm_cell.out"] == "default"  # CompositeExplicitAutograd
    assert rows["aten::_thnn_fused_lstm_cell_backward"] == "composite"
    assert "fallback" not in rows.values()

    monkeypatch.chdir(tmp_path)  # outside a project: as a new project from the current template
    rows = _ops_status(api.list_ops("*_thnn_fused_lstm_cell*"))
    assert rows["aten::_thnn_fused_lstm_cell"] == "native"
    rows = _ops_status(api.list_ops("cudnn_convolution*"))
    assert rows["aten::cudnn_convolution"] == "no CPU kernel"

    out = run_cli("ops", "cudnn_conv*", "--project", str(project))
    assert out.returncode == 0
    assert any(ln.split()[0] == "aten::cudnn_convolution" and "no CPU kernel" in ln for ln in out.stdout.splitlines())


def test_skipped_tests_are_read_from_pytests_summary(tmp_path):
    log = tmp_path / "test.log"
    log.write_text(
        "ss.                                                                      [100%]\n"
        "=========================== short test summary info ============================\n"
        "SKIPPED [2] tests/ops/test_foo.py:64: no OpInfo sample calls aten::foo.out; "
        "add calls to extra_calls() in /p/x.py\n"
        "SKIPPED [1] tests/ops/test_bar.py: no differentiable sample of aten::bar\n"
        "1 passed, 3 skipped in 2.46s\n"
    )
    assert build.skipped_tests(log) == [
        build.Skipped(
            2, "tests/ops/test_foo.py", "no OpInfo sample calls aten::foo.out; add calls to extra_calls() in /p/x.py"
        ),
        build.Skipped(1, "tests/ops/test_bar.py", "no differentiable sample of aten::bar"),
    ]
    assert build.skipped_tests(tmp_path / "missing.log") == []


SUMMARY = (
    "SKIPPED [1] tests/ops/test_foo.py:33: no OpInfo sample calls aten::foo; add calls to extra_calls() in "
    "/p/tests/ops/test_foo.py\n1 passed, 1 skipped in 1.00s\n"
)


def test_build_and_test_keeps_what_the_new_tests_skipped(project, monkeypatch):
    """The test step of a change (add-op's) keeps the new tests' log, whose -rs summary add-op reports."""
    from backendgen.commands import transaction
    from backendgen.plumbing.progress import Reporter
    from backendgen.project.on_disk import Project

    def run_tests(root, paths, *, name):
        assert paths == ["tests/ops/test_foo.py"]
        log = root / "build" / "fake-test.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(SUMMARY)
        return log

    monkeypatch.setattr(build, "installed_from", lambda root, dist: False)
    monkeypatch.setattr(build, "build", lambda *args, **kwargs: None)
    monkeypatch.setattr(build, "run_tests", run_tests)
    with transaction.change(Project.load(project)) as change:
        change.build_and_test(Reporter(), tests=["tests/ops/test_foo.py"], early=True, name="add-op-test")
    skipped = build.skipped_tests(change.log)
    assert change.tested and skipped == [
        build.Skipped(1, "tests/ops/test_foo.py", SUMMARY.split(": ", 1)[1].splitlines()[0])
    ]


def test_add_op_output_names_the_skipped_tests(project, monkeypatch):
    from typer.testing import CliRunner

    from backendgen.cli import app as cli

    def add_ops(names, project_dir, **kwargs):
        res = api.AddOpsResult(
            project, added=["aten::foo"], files=[project / "csrc/aten/ops/foo.cpp"], built=True, tested=True
        )
        res.skipped = build.skipped_tests(_log(project))
        return res

    def _log(root):
        (root / "t.log").write_text(SUMMARY)
        return root / "t.log"

    monkeypatch.setattr(api, "add_ops", add_ops)
    out = CliRunner().invoke(cli.app, ["add-op", "foo", "--project", str(project)])
    assert out.exit_code == 0, out.output
    assert "aten::foo: built and tested (1 of the new tests skipped)" in out.output
    assert "skipped 1 in tests/ops/test_foo.py: no OpInfo sample calls aten::foo" in out.output


def test_ops_and_add_op_know_the_sync_batch_norm_operators_are_native(project):
    """SyncBatchNorm's CUDA-only operators and the out_dtype= matrix products: native in the
    template (csrc/aten/sync_batch_norm.cpp, out_dtype_matmul.cpp), so `ops` shows none as fallback
    or missing and add-op writes nothing for them."""
    rows = _ops_status(api.list_ops("batch_norm_", project))
    assert {rows[n] for n in SYNC_BATCH_NORM} == {"native"}, {n: rows.get(n) for n in SYNC_BATCH_NORM}
    rows = _ops_status(api.list_ops("mm.dtype", project))
    wide = ["aten::mm.dtype", "aten::bmm.dtype_out", "aten::addmm.dtype", "aten::baddbmm.dtype_out"]
    assert {rows[n] for n in wide} == {"native"}, {n: rows.get(n) for n in wide}
    before = _snapshot(project)
    out = run_cli("add-op", "aten::batch_norm_stats", "batch_norm_backward_elemt", "--no-build", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "aten::batch_norm_stats is already native in this project" in out.stdout, out.stdout
    assert "nothing to do" in out.stdout
    assert _snapshot(project) == before


def test_add_op_rewrites_the_small_registration_files_and_leaves_new_s_alone(project):
    """Template 12 cuts the generated registration in three, each a unit of its own: an add-op
    rewrites the kernels added since `new` (registration_added.cpp) and the names sent to the CPU
    fallback (fallback_names.cpp), and leaves registration.cpp, whose m.impl lines take seconds to
    compile, as it was (its time stamp too: the rebuild does not compile it)."""
    generated = project / "csrc/aten/ops/generated"
    main, added, names = (generated / f for f in ("registration.cpp", "registration_added.cpp", "fallback_names.cpp"))
    before = main.read_bytes(), main.stat().st_mtime_ns
    assert "m.impl(" not in added.read_text() and '"erfinv",' in names.read_text()
    res = api.add_ops(["aten::abs.out", "aten::erfinv.out"], project, build_it=False)
    assert res.added == ["aten::abs.out", "aten::erfinv.out"]
    assert (main.read_bytes(), main.stat().st_mtime_ns) == before
    text = added.read_text()
    assert 'm.impl("abs.out", TORCH_FN(' in text and 'm.impl("erfinv.out", TORCH_FN(' in text
    assert 'm.impl("abs.out"' not in main.read_text()
    # a structured operator whose out= form is native leaves the fallback's list (its functional form runs here)
    assert '"erfinv",' not in names.read_text() and '"erfinv_",' not in names.read_text()
    # removing it puts the list back as it was, and still leaves registration.cpp alone
    api.remove_ops(["aten::erfinv.out"], project)
    assert '"erfinv",' in names.read_text() and 'm.impl("erfinv.out"' not in added.read_text()
    assert (main.read_bytes(), main.stat().st_mtime_ns) == before
