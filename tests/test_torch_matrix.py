"""The support matrix (the manifest's tested torch versions, support.TESTED) and the real upgrade, as a user meets them.

For each tested torch: a FRESH virtualenv with `torch==X` and this repo installed plainly (a wheel
built once per session, no extras), then in an empty directory `backendgen new` (on the default torch
with the minimal driver, `--driver minimal`, whose model suite then runs too), `add-op` of a few
operators (structured ones included), an operator of the backend's own with a backward, an autograd
override and an autocast policy and `check`, each through the real command, and (for each torch
but the default one, whose compile and multi-process tests the session runs itself) the project's
torch.compile tests with that torch's Dynamo and Inductor, as `pytest -m compile`, and its tests of
device tensors shared through that torch's torch.multiprocessing (tests/distributed/test_ipc.py).
Then the upgrade: a project built on torch 2.13.0 with kernels for operators 2.14.1 removed or
changed, checked under 2.14.1, fixed with the steps of docs/upgrading.md.

Slow: every session installs every torch in new virtualenvs (the CUDA builds are ~5 GB each; see README,
"Supported torch versions"). Each virtualenv is made once per session, in the background from the
session's start (tests/torch_venvs.py: the tests are marked torch_venv), and deleted at its end. Each
test's work (a scenario below: every command and assertion) runs in the background as well, as soon
as its venvs are made, on the CPU the rest of the session leaves idle; the test waits for its outcome.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import unique_device
from torch_venvs import Venv, log

from backendgen.torchdb import support

pytestmark = pytest.mark.slow

ADD_OPS = ["aten::abs.out", "topk", "index.Tensor", "cat"]  # plain, and structured with a list argument
# One device name for the session's projects here: each torch's venv builds a project of it (its backend
# uninstalled after each test), so the upgrade's builds of the same sources with the same torch are ccache's.
DEVICE = unique_device("mx")


def _installed_torch(venv: Venv) -> str:
    proc = venv.run(venv.python, "-c", "import importlib.metadata as m; print(m.version('torch'))", cwd=venv.path)
    return proc.stdout.strip()


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def _new_add_op_check(venvs, tmp: Path, version: str) -> None:
    """The scenario of test_new_add_op_check_on_a_tested_torch[version] (run in the background)."""
    venv = venvs(version)
    start = time.monotonic()
    assert _installed_torch(venv).split("+")[0] == version
    device = DEVICE
    work = tmp / "empty"
    work.mkdir()
    try:
        # the default torch's emulator project is the session's own (the same torch and template, built the
        # same way): here the default torch's project is the minimal driver's (`new --driver minimal`: the port
        # API alone, device memory the host cannot address), so every command below runs on it too; each
        # project runs its generated quick suite in `new`
        default = version == support.TESTED[0]
        driver = ["--driver", "minimal"] if default else []
        venv.backends.add(f"torch-{device}")  # uninstalled at the end, however `new` ends
        new = venv.run("backendgen", "new", device, *driver, cwd=work)
        assert new.returncode == 0 and "built and tested" in new.stdout, new.stdout + new.stderr
        assert "note:" not in new.stdout  # a tested torch gets no "untested" note
        project = work / f"torch-{device}"
        # kernels, the backend's own operator with a backward and an autocast policy, typed by this
        # torch's torchgen, written first; the autograd override's add-op then builds them all (one
        # build, not four) and runs its tests; every other generated test (gradcheck, FakeTensorMode,
        # torch.compile with aot_eager, the policy under autocast) runs below with this torch
        add = venv.run("backendgen", "add-op", *ADD_OPS, "--no-build", cwd=project)
        assert add.returncode == 0, add.stdout + add.stderr
        for op in ("aten::abs.out", "aten::topk.values", "aten::index.Tensor_out", "aten::cat.out"):
            assert op in add.stdout
        own = venv.run(
            "backendgen",
            "add-op",
            f"{device}::scale",
            "--schema",
            "(Tensor x, float alpha=1.0) -> Tensor",
            "--body",
            "x * alpha + at::sin(x)",
            "--autograd",
            "--no-build",
            cwd=project,
        )
        assert own.returncode == 0, own.stdout + own.stderr
        policy = venv.run("backendgen", "amp", "set", "add.Tensor", "lower_precision_fp", "--no-build", cwd=project)
        assert policy.returncode == 0, policy.stdout + policy.stderr
        added = venv.run("backendgen", "add-op", "aten::hypot", "--autograd", cwd=project)
        assert added.returncode == 0 and "built and tested" in added.stdout, added.stdout + added.stderr
        # the added operators' generated tests (the default operators' ran in `new`'s suite)
        added_tests = sorted(
            str(p.relative_to(project))
            for name in ("abs", "topk", "index", "cat", "scale", "hypot")
            for p in (project / "tests" / "ops").glob(f"test_*{name}*.py")
        )
        generated = venv.run(
            str(venv.python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *added_tests,
            "tests/test_amp_policies.py",
            cwd=project,
        )
        assert generated.returncode == 0 and "failed" not in generated.stdout, generated.stdout[-4000:]
        for name in ("abs", "topk", "index", "cat", "scale"):
            assert list((project / "tests" / "ops").glob(f"test_*{name}*.py")), name  # the tests that ran
        check = venv.run("backendgen", "check", cwd=project)
        assert check.returncode == 0, check.stdout + check.stderr
        _no_traceback(check)
        report = json.loads(venv.run("backendgen", "check", "--json", cwd=project).stdout)
        assert report["errors"] == 0 and report["warnings"] == 0, report["findings"]
        assert any(f["detail"].get("kind") == "tested" for f in report["findings"])
        assert any(f["subject"] == f"{device}::*" and f["severity"] == "ok" for f in report["findings"])
        if default:
            _minimal_driver_project(venv, project, device)
        # torch.compile on the device with this torch's Dynamo and Inductor (compiler/ in the project),
        # as the generated README runs it (`backendgen test --compile`, which first reruns the quick
        # suite `new` just ran, is the session's own test on the default torch: tests/test_compile.py),
        # and device tensors through this torch's torch.multiprocessing (tests/distributed/test_ipc.py)
        if version != support.TESTED[0]:
            # one session: the ipc scenarios' processes start with it and run beside the compile tests
            compiled = venv.run(
                str(venv.python),
                "-m",
                "pytest",
                "-q",
                "-rA",
                "-p",
                "no:cacheprovider",
                "-m",
                "compile or distributed",
                "tests/test_compile.py",
                "tests/distributed/test_ipc.py",
                cwd=project,
            )
            assert compiled.returncode == 0 and " passed" in compiled.stdout and "failed" not in compiled.stdout, (
                compiled.stdout[-4000:] + compiled.stderr[-2000:]
            )
            # every ipc scenario ran (none skipped) with both start methods
            passed = {
                ln.split("::", 1)[1]
                for ln in compiled.stdout.splitlines()
                if ln.startswith("PASSED tests/distributed/")
            }
            assert len(passed) == 10, compiled.stdout[-4000:]
    finally:
        venv.uninstall_backends()  # one PrivateUse1 backend per environment: leave room for the next test
    log(f"matrix torch {version}: {time.monotonic() - start:.0f} s after its venv was ready")


@pytest.mark.parametrize(
    "version", [pytest.param(v, marks=pytest.mark.torch_venv(v, scenario=_new_add_op_check)) for v in support.TESTED]
)
def test_new_add_op_check_on_a_tested_torch(version, torch_venvs, request):
    torch_venvs.outcome(request.node.nodeid)


def _minimal_driver_project(venv: Venv, project, device: str) -> None:
    """What the minimal-driver project promises beyond the commands above: no trace of the emulator, a raw
    host read of device memory crashes, and its model suite (real models trained against the CPU, eager
    and compiled, staged through the driver's copies) passes."""
    files = [p for p in project.rglob("*") if p.is_file() and "build" not in p.relative_to(project).parts]
    assert not (project / "csrc" / "driver" / "emulator.h").exists()
    named = [
        str(p.relative_to(project))
        for p in files
        if p.suffix != ".so" and "emulat" in p.read_bytes().decode("utf-8", "replace").lower()
    ]
    assert named == [], named
    raw_read = venv.run(
        str(venv.python),
        "-c",
        f"import ctypes, torch; x = torch.ones(4, device='{device}'); ctypes.string_at(x.data_ptr(), 16)",
        cwd=project,
    )
    assert raw_read.returncode == -11, (raw_read.returncode, raw_read.stderr[-2000:])  # SIGSEGV, as on a chip
    models = venv.run(
        str(venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "models", "tests/models", cwd=project
    )
    assert models.returncode == 0 and " passed" in models.stdout and "failed" not in models.stdout, (
        models.stdout[-4000:] + models.stderr[-2000:]
    )


# The first release that removed and changed operators after the oldest tested one (docs/upgrading.md).
UPGRADE = ("2.13.0", "2.14.1")


def _upgrade(venvs, tmp: Path) -> None:
    """The scenario of test_upgrade_2_13_0_to_2_14_1 (run in the background)."""
    assert set(UPGRADE) <= set(support.TESTED)
    old, new = venvs(UPGRADE[0]), venvs(UPGRADE[1])
    start = time.monotonic()
    device = DEVICE
    work = tmp / "empty"
    work.mkdir()
    project = work / f"torch-{device}"
    dist = f"torch-{device}"
    try:
        old.backends.add(dist)
        made = old.run("backendgen", "new", device, "--no-test", cwd=work)
        assert made.returncode == 0 and "built" in made.stdout, made.stdout + made.stderr
        add = old.run("backendgen", "add-op", "cholesky", "_cdist_backward", cwd=project)
        assert add.returncode == 0 and "built and tested" in add.stdout, add.stdout + add.stderr
        old.uninstall_backends()

        # the same directory under the new torch
        check = new.run("backendgen", "check", cwd=project)
        assert check.returncode == 1, check.stdout + check.stderr
        _no_traceback(check)
        for named in (
            "aten::cholesky",
            "removed from torch",
            "aten::_cdist_backward",
            "schema changed",
            f"built for torch {UPGRADE[0]} but torch {UPGRADE[1]} is installed",
        ):
            assert named in check.stdout, (named, check.stdout)
        report = json.loads(new.run("backendgen", "check", "--json", cwd=project).stdout)
        kinds = {(f["subject"], f["detail"].get("kind")) for f in report["findings"] if f["severity"] != "ok"}
        assert ("aten::cholesky", "removed") in kinds
        assert ("aten::_cdist_backward", "schema_changed") in kinds
        assert any(kind == "torch_mismatch" for _, kind in kinds), kinds  # said before _C's undefined symbol
        refused = new.run("backendgen", "add-op", "abs.out", "--no-build", cwd=project)
        assert refused.returncode == 2 and "run backendgen check" in refused.stderr
        accept_too_early = new.run("backendgen", "check", "--accept", cwd=project)
        assert accept_too_early.returncode == 1 and "not accepted" in accept_too_early.stdout

        # the fix, step by step (docs/upgrading.md)
        removed = new.run("backendgen", "remove-op", "cholesky", cwd=project)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert not list((project / "csrc/aten/ops").glob("cholesky*"))
        new.backends.add(dist)
        built = new.run("backendgen", "build", cwd=project)
        assert built.returncode == 0, built.stdout + built.stderr
        passed = new.run("backendgen", "check", cwd=project)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        accepted = new.run("backendgen", "check", "--accept", cwd=project)
        assert accepted.returncode == 0 and "accepted: backendgen.json now targets torch" in accepted.stdout, (
            accepted.stdout + accepted.stderr
        )
        assert "aten::_cdist_backward" in accepted.stdout  # its renamed argument is recorded
        tested = new.run("backendgen", "build", "--test", cwd=project)
        assert tested.returncode == 0 and "built and tested" in tested.stdout, tested.stdout + tested.stderr
        final = json.loads(new.run("backendgen", "check", "--json", "--strict", cwd=project).stdout)
        assert final["exit_code"] == 0 and final["warnings"] == 0, final["findings"]
        assert new.run("backendgen", "add-op", "abs.out", "--dry-run", cwd=project).returncode == 0
    finally:
        old.uninstall_backends()
        new.uninstall_backends()
    log(f"upgrade: {time.monotonic() - start:.0f} s after its venvs were ready")


@pytest.mark.torch_venv(*UPGRADE, scenario=_upgrade)
def test_upgrade_2_13_0_to_2_14_1(torch_venvs, request):
    """docs/upgrading.md, as tested: a project built on torch 2.13.0 with kernels for operators
    2.14.1 removed (cholesky) and changed (_cdist_backward: grad -> grad_output)."""
    torch_venvs.outcome(request.node.nodeid)
