"""`backendgen profile`: a user's script runs on the backend; what ran on the CPU fallback is ranked,
each operator with the add-op argument that makes it native; after adding them they are gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from backendgen import api
from backendgen.commands import profile as prof
from backendgen.project.on_disk import Project
from backendgen.toolchain import build
from backendgen.torchdb.opdb import load_opdb

# A small CNN training step with Adamax; the device comes from the script's own arguments. Its layers
# and optimizer are ones a fresh project runs on the CPU fallback (conv + batch norm + relu,
# cross_entropy, SGD and Adam are native there: the template's default_ops).
CNN = """
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--device", required=True)
parser.add_argument("--steps", type=int, default=2)
opts = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.GELU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
).to(opts.device)
opt = torch.optim.Adamax(model.parameters(), lr=1e-2)
x = torch.randn(4, 3, 8, 8, device=opts.device)
y = torch.randint(0, 10, (4,), device=opts.device)
for step in range(opts.steps):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
"""

# What the test expects to see fall back, named by the add-op target (what add-op would register),
# not by the name the dispatcher happens to use for the call:
#   group norm: native_group_norm (its backward too); GELU: structured (gelu.out, gelu_backward.grad_input);
#   pooling: max_pool2d_with_indices (structured) and its backward;
#   Adamax's per-parameter updates: on PrivateUse1 torch.optim.Adamax takes the foreach path, whose
#   CompositeExplicit slow path calls per-tensor abs and clamp_min_ (for _foreach_maximum_) on the device.
EXPECTED = {
    "group norm": {"aten::native_group_norm", "aten::native_group_norm_backward"},
    "activation": {"aten::gelu.out", "aten::gelu_backward.grad_input"},
    "pooling": {"aten::max_pool2d_with_indices.out", "aten::max_pool2d_with_indices_backward.grad_input"},
    "adamax": {"aten::abs.out", "aten::clamp_min.Tensor_out"},
}


def _meta(root: Path) -> dict:
    return json.loads((root / "backendgen.json").read_text())


def _device(root: Path) -> str:
    return _meta(root)["device"]


@pytest.fixture(scope="module")
def _copy(built_project, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("profile") / "project"
    shutil.copytree(built_project, dest, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    return dest


@pytest.fixture
def installed(_copy) -> Path:
    """A copy of the session's project that `import torch` loads. Other tests install copies of their
    own (and break them on purpose), so this is (re)installed whenever it is not the one installed."""
    if not build.installed_from(_copy, _meta(_copy)["dist_name"]):
        api.build_backend(_copy)
    return _copy


def _rows(stdout: str) -> dict[str, str]:
    """The profile table: operator column -> last column (the add-op argument or the reason)."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^\s+(\d+)\s+([\d.]+|-)\s+([\d.]+%|-)\s+(\S+(?: \+ \S+)*)\s+(.+)$", line)
        if m:
            rows[m.group(4)] = m.group(5)
    return rows


def test_cnn_with_adam_names_its_fallbacks_and_their_add_op_commands_make_them_native(installed, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CNN)
    device = _device(installed)
    start = time.monotonic()

    out = run_cli("profile", str(script), "--device", device, "--steps", "3", cwd=installed)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.findall(r"^step \d", out.stdout, re.M) == ["step 0", "step 1", "step 2"]  # the script's own output
    rows = _rows(out.stdout)
    targets = set(rows.values())
    for what, ops in EXPECTED.items():
        assert ops & targets, (what, out.stdout)
    for op in set().union(*EXPECTED.values()) & targets:
        row = next(name for name, target in rows.items() if target == op)
        assert re.search(r"aten::\w+", row), row
    # one line per add-op target, and one command for them all, last
    assert len(targets) == len(rows)
    command = out.stdout.strip().splitlines()[-1].strip()
    assert command.startswith("backendgen add-op ") and "--project" not in command
    added = command.split()[2:]
    assert set(added) == {t for t in targets if t.startswith("aten::")}
    assert set().union(*EXPECTED.values()) & targets <= set(added)
    first = time.monotonic()

    # run the printed command as a user would, in the project ...
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    ran = subprocess.run(
        command, shell=True, cwd=installed, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "built and tested" in ran.stdout
    adding = time.monotonic()

    # ... and profile again: what it added no longer runs on the CPU
    again = run_cli("profile", "--json", str(script), "--device", device, "--steps", "3", cwd=installed)
    assert again.returncode == 0, again.stdout + again.stderr
    report = json.loads(again.stdout)
    assert "step 1 loss" in again.stderr  # with --json the script's stdout goes to stderr
    still = {e["target"] for e in report["operators"]}
    assert not still & set(added), still & set(added)
    # the native kernels train the model as the fallback did (same seed, same data, same losses)
    before = [float(v) for v in re.findall(r"loss (\S+)", out.stdout)]
    after = [float(v) for v in re.findall(r"loss (\S+)", again.stderr)]
    assert len(before) == len(after) == 3 and after == pytest.approx(before, rel=1e-3, abs=1e-4)
    assert before[2] < before[0]
    print(
        f"\ntimings: profile {first - start:.1f} s, add-op of {len(added)} ops {adding - first:.1f} s, "
        f"profile again {time.monotonic() - adding:.1f} s"
    )


FAILING = """
import json, os, sys
import torch
dev = sys.argv[1]
with open(sys.argv[2], "w") as fh:
    json.dump(sys.argv[1:], fh)
x = torch.ones(5, device=dev)
torch.sin(x)
torch.sin(x)
how = sys.argv[3]
print("about to stop:", how)
if how == "raise":
    raise ValueError("boom from the script")
if how == "exit":
    sys.exit(3)
if how == "os_exit":
    sys.stdout.flush()
    os._exit(4)
"""


@pytest.mark.parametrize("how, status", [("raise", 1), ("exit", 3), ("os_exit", 4), ("return", 0)])
def test_a_script_that_fails_still_gets_its_profile_and_its_arguments(installed, tmp_path, how, status):
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    argv_file = tmp_path / "argv.json"
    # the script's own options (--json, --project among them) go to the script, not to backendgen
    args = [_device(installed), str(argv_file), how, "--json", "--project", "x y", "-q"]
    out = run_cli("profile", "--project", str(installed), str(script), *args, cwd=tmp_path)
    assert out.returncode == (0 if status == 0 else 1), out.stdout + out.stderr
    assert json.loads(argv_file.read_text()) == args
    assert f"about to stop: {how}" in out.stdout
    rows = _rows(out.stdout)
    sin = [name for name, target in rows.items() if target == "aten::sin.out"]
    assert sin and "aten::sin" in sin[0], out.stdout
    assert re.search(rf"^\s+2\s+[\d.]+\s+[\d.]+%\s+{re.escape(sin[0])}\s", out.stdout, re.M), out.stdout
    if status:
        assert f"note: the script exited with status {status}" in out.stdout
    else:
        assert "note:" not in out.stdout
    if how == "raise":
        assert "ValueError: boom from the script" in out.stderr
        assert (
            f'File "{script}"' in out.stderr and "runpy" not in out.stderr
        )  # the script's frames, as python shows them


def test_json_report_parses_and_keeps_the_scripts_stdout_apart(installed, tmp_path):
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "s.py"
    script.write_text("import helper  # beside the script, as `python scripts/s.py` finds it\n" + FAILING)
    (tmp_path / "scripts" / "helper.py").write_text("")
    out = run_cli(
        "profile",
        "--json",
        "--project",
        str(installed),
        str(script),
        _device(installed),
        str(tmp_path / "argv.json"),
        "return",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert "about to stop: return" in out.stderr
    assert report["exit_status"] == 0 and report["collected"] and report["seconds"] > 0
    entry = next(e for e in report["operators"] if e["add_op"] == "aten::sin.out")
    assert entry["calls"] == 2 and entry["seconds"] > 0 and 0 < entry["share"] < 1
    assert report["command"].startswith("backendgen add-op ") and "aten::sin.out" in report["command"]
    assert f"--project {installed}" in report["command"]  # the project was named: so is it in the command


def test_operators_one_kernel_serves_are_merged_and_the_others_get_a_reason(rendered_project):
    """The mapping follows add-op's plan, not the dispatcher's spelling: a structured op falling back
    under its functional or its out= name is one line, one add-op argument."""
    project = Project.load(rendered_project)
    stats = {
        "aten::mse_loss.out": [2, 0.25],
        "aten::mse_loss": [1, 0.5],
        "aten::atan2_": [4, 0.01],
        "aten::atan2.out": [4, 0.02],
        "aten::_values": [3, 0.0],  # a view of sparse tensors only: no CPU kernel to take its geometry from
        "aten::dropout": [1, 0.0],
        "myns::custom": [1, 1.0],
        "aten::mul.out": [1, 0.001],  # native in the project (a default op): a build older than the project
    }
    entries = prof.analyze(stats, load_opdb(), project)
    by = {tuple(sorted(e.names)): e for e in entries}
    mse = by[("aten::mse_loss", "aten::mse_loss.out")]
    assert mse.target == "aten::mse_loss.out" and mse.reason is None and mse.calls == 3 and mse.seconds == 0.75
    atan2 = by[("aten::atan2.out", "aten::atan2_")]
    assert atan2.target == "aten::atan2.out" and atan2.calls == 8
    assert (
        by[("aten::_values",)].target is None
        and "returns a view but has no CPU kernel" in by[("aten::_values",)].reason
    )
    assert by[("aten::dropout",)].target is None and "CompositeImplicitAutograd" in by[("aten::dropout",)].reason
    assert by[("myns::custom",)].target is None and "not an ATen operator" in by[("myns::custom",)].reason
    assert "rebuild" in by[("aten::mul.out",)].reason
    assert entries[0].names == ["myns::custom"] and entries[1] is mse  # ranked by time
    targets = [e.target for e in entries if e.target and e.reason is None]
    assert prof.add_op_command(targets, None) == "backendgen add-op aten::mse_loss.out aten::atan2.out"
    assert (
        prof.add_op_command(["aten::abs.out"], Path("/tmp/my project"))
        == "backendgen add-op aten::abs.out --project '/tmp/my project'"
    )


def test_bad_input_is_one_line_and_exit_2(rendered_project, project_copy, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    cases = [
        (("profile", str(tmp_path / "missing.py")), rendered_project, "no such script"),
        (("profile", str(script)), tmp_path, "not inside a backendgen project"),
        (("profile", "--project", str(tmp_path / "nope"), str(script)), tmp_path, "not a directory"),
        (("profile", "--project", str(tmp_path), str(script)), tmp_path, "not a backendgen project"),
        (("profile", str(script)), rendered_project, "is not installed"),  # rendered, never built
        (("profile", str(script)), project_copy, "is installed from"),  # the installed one is elsewhere
    ]
    for args, cwd, message in cases:
        out = run_cli(*args, cwd=cwd)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("error:") and message in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "ran" not in out.stdout  # the script did not run
