"""The scripts in examples/ run against the session's freshly generated backend, as a user runs
them: `python examples/<name>.py` in a new interpreter where `import torch` autoloads the backend.
Each must exit 0 and print what it shows; a new example without a test here fails the suite."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TESTED = {"train", "checkpoint", "fallback_report", "custom_op", "compile", "train_ddp"}


def _device(root: Path) -> str:
    return json.loads((root / "backendgen.json").read_text())["device"]


def run_example(
    name: str, *args: str, cwd: Path, env: dict | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}  # autoload on, as for a user
    full.update(env or {})
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def _ok(ran: subprocess.CompletedProcess) -> str:
    assert ran.returncode == 0, f"exit {ran.returncode}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    return ran.stdout


def test_every_example_has_a_test():
    scripts = {p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert scripts == TESTED, (
        f"examples without a test: {sorted(scripts - TESTED)}; tests of missing examples: {sorted(TESTED - scripts)}"
    )


@pytest.mark.parametrize(
    "extra", [[], ["--dtype", "float16", "--optimizer", "sgd", "--steps", "12"]], ids=["bf16-adam", "fp16-sgd"]
)
def test_train(installed, tmp_path, extra):
    dev = _device(installed)
    out = _ok(run_example("train", *extra, cwd=tmp_path))
    assert f"training on {dev}:0" in out
    dtype = "float16" if "float16" in extra else "bfloat16"
    assert f"under autocast: logits torch.{dtype}, loss torch.float32" in out
    before, after = map(float, re.search(r"held-out batch: loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert after < before
    assert f"weights: torch.float32 on {dev}:0" in out
    assert out.rstrip().endswith("ok: the model trained on the device")


def test_train_with_explicit_device(installed, tmp_path):
    dev = _device(installed)
    out = _ok(run_example("train", "--device", dev, "--steps", "4", cwd=tmp_path))
    assert f"training on {dev}:0" in out


def test_checkpoint(installed, tmp_path):
    dev = _device(installed)
    out = _ok(run_example("checkpoint", "--dir", str(tmp_path / "ckpt"), cwd=tmp_path))
    assert (tmp_path / "ckpt" / f"checkpoint-{dev}.pt").is_file()
    for line in [
        "torch.load(path): 17 tensors equal",
        'map_location="cpu": 17 tensors equal to what was saved, on cpu\n',
        f'map_location="{dev}:1": 17 tensors equal to what was saved, on {dev}:1\n',
        f'map_location={{"{dev}:0": "{dev}:1"}}',
        f'a CPU checkpoint, map_location="{dev}:0": 17 tensors equal to what was saved, on {dev}:0\n',
        "the layout tag came back with the tensor",
        "weights equal the uninterrupted run's",
    ]:
        assert line in out, out


def test_checkpoint_on_one_device_skips_the_cross_device_loads(installed, tmp_path):
    dev = _device(installed)
    out = _ok(run_example("checkpoint", cwd=tmp_path, env={f"{dev.upper()}_DEVICE_COUNT": "1"}))
    assert f"(one {dev} device: the loads onto {dev}:1 are skipped)" in out
    assert f'map_location="{dev}:1"' not in out


def test_fallback_report_names_the_operators_and_its_command_is_accepted(installed, tmp_path):
    out = _ok(run_example("fallback_report", cwd=tmp_path))
    assert re.search(r"operators ran on the CPU fallback, \d+ calls", out)
    # layer norm and GELU have no kernel in a fresh backend: they fall back, each with its add-op target
    assert "aten::native_layer_norm -> aten::native_layer_norm" in out
    assert "aten::gelu -> aten::gelu.out" in out
    command = out.rstrip().splitlines()[-1].strip()
    words = shlex.split(command)
    assert words[:2] == ["backendgen", "add-op"] and words[-2:] == ["--project", str(installed.resolve())]
    assert "aten::gelu.out" in words
    dry = run_cli(*words[1:], "--dry-run")  # the printed command is one add-op accepts for this project
    assert dry.returncode == 0, dry.stderr
    assert re.search(r"^would write csrc/aten/ops/gelu\w*\.cpp$", dry.stdout, re.M), dry.stdout


def test_custom_op(installed, tmp_path):
    package = json.loads((installed / "backendgen.json").read_text())["package"]
    out = _ok(run_example("custom_op", cwd=tmp_path))
    assert f"{package}::layout_tag(Tensor self) -> bool" in out
    assert f"{package}::set_layout_tag(Tensor self, bool tagged) -> ()" in out
    assert f"after torch.ops.{package}.set_layout_tag(x, True): True" in out
    assert "after torch.save/torch.load: layout_tag -> True" in out
    assert "a call that does not match the schema is refused" in out


def test_compile(installed, tmp_path):
    dev = _device(installed)
    out = _ok(run_example("compile", cwd=tmp_path))
    assert f"compiled training on {dev} matched eager for 3 steps" in out
    assert re.search(r"eager ran .*aten::sin.* on the CPU fallback; compiled: nothing", out)


@pytest.mark.parametrize("nproc", [2, 4])
def test_train_ddp_matches_one_process_on_the_whole_batch(installed, tmp_path, nproc):
    dev = _device(installed)
    out = _ok(run_example("train_ddp", "--nproc", str(nproc), cwd=tmp_path, timeout=600))
    assert f"{nproc} processes on {dev} (c10d backend '{dev}ccl'), 10 DDP steps" in out
    assert "every rank holds the parameters one process gets on the whole batch" in out


def test_examples_refuse_without_a_backend_and_for_another_device(installed, tmp_path):
    off = run_example("custom_op", cwd=tmp_path, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert off.returncode == 2
    assert "no PrivateUse1 backend is loaded in this process (TORCH_DEVICE_BACKEND_AUTOLOAD=0 is set" in off.stderr
    other = run_example("train", "--device", "otherchip", cwd=tmp_path)
    assert other.returncode == 2
    assert f"--device otherchip: the backend loaded in this process is '{_device(installed)}'" in other.stderr
