"""The programs backendgen runs in a child Python (backendgen/programs/), each run as backendgen
runs it: `python -m backendgen.programs.NAME`, autoload off unless said otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from backendgen.plumbing.environment import subprocess_env


def _run(name: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"backendgen.programs.{name}", *args],
        capture_output=True,
        text=True,
        env=env or subprocess_env(autoload="0"),
        timeout=300,
        check=False,
        **kw,
    )


def test_programs_import_no_other_backendgen_module():
    code = (
        "import json, sys, backendgen.programs.probe, backendgen.programs.warm_pytest, "
        "backendgen.programs.torch_names, backendgen.programs.profile_runner, backendgen.programs.pytest_main; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('backendgen') or m == 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        "backendgen",
        "backendgen.plumbing",  # the package: its __init__ imports nothing
        "backendgen.plumbing.files",
        "backendgen.programs",
        "backendgen.programs.probe",
        "backendgen.programs.profile_runner",
        "backendgen.programs.pytest_main",  # warm_pytest's, too
        "backendgen.programs.torch_names",
        "backendgen.programs.warm_pytest",
    ]


def test_probe_reports_apis_schemas_and_a_package_that_fails_to_load():
    req = {
        "package": "no_such_backend_pkg",
        "py_apis": ["torch.Stream", "torch.no_such_api"],
        "schemas": {
            "aten::add.Tensor": "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "aten::no_such_op": "aten::no_such_op(Tensor self) -> Tensor",
        },
        "ops": ["aten::add.Tensor"],
        "keys": {},
    }
    out = _run("probe", json.dumps(req))
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [next(iter(r)) for r in results] == ["py_apis", "schemas", "load"]
    assert results[0]["py_apis"] == {"torch.Stream": True, "torch.no_such_api": False}
    add = results[1]["schemas"]["aten::add.Tensor"]
    assert add["recorded"] == add["live"] == req["schemas"]["aten::add.Tensor"]
    assert results[1]["schemas"]["aten::no_such_op"]["live"] is None
    load = results[2]["load"]
    assert load["ok"] is False and load["type"] == "ModuleNotFoundError" and "no_such_backend_pkg" in load["message"]


def test_probe_of_a_package_that_loads(tmp_path):
    (tmp_path / "fine_pkg.py").write_text("")
    req = {
        "package": "fine_pkg",
        "py_apis": [],
        "schemas": {},
        "ops": ["aten::add.Tensor"],
        "keys": {"aten::add.Tensor": ["CPU"]},
    }
    req["device_module"] = ["device_count", "_utils._get_device_index"]
    out = _run("probe", json.dumps(req), env=subprocess_env(autoload="0", pythonpath=tmp_path))
    lines = {key: value for line in out.stdout.splitlines() for key, value in json.loads(line).items()}
    load = lines["load"]
    assert load["ok"] is True and load["backend_name"] == "privateuseone"
    assert load["kernels"]["aten::add.Tensor"]["has"] is False and load["keyed"] == {"aten::add.Tensor": {"CPU": True}}
    # no backend renamed PrivateUse1: there is no torch.<device> module, so it has none of the attributes
    assert lines["device_module"] == {"device_count": False, "_utils._get_device_index": False}


def test_torch_names():
    out = _run("torch_names")
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout)
    assert {"tensor", "device", "ops"} <= set(names) and names == sorted(names)


def _tiny_suite(tmp_path: Path) -> Path:
    (tmp_path / "test_tiny.py").write_text(
        "import os\n\n\ndef test_autoload_is_unset():\n    assert 'TORCH_DEVICE_BACKEND_AUTOLOAD' not in os.environ\n"
    )
    return tmp_path


def test_warm_pytest_runs_the_tests_on_go(tmp_path):
    req = {"preload": ["json", "no_such_module_to_preload"], "pytest": ["-q", "-p", "no:cacheprovider", "test_tiny.py"]}
    out = _run("warm_pytest", json.dumps(req), cwd=_tiny_suite(tmp_path), input="go\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_warm_pytest_without_go_runs_nothing(tmp_path):
    req = {"preload": [], "pytest": ["-q", "test_tiny.py"]}
    out = _run("warm_pytest", json.dumps(req), cwd=_tiny_suite(tmp_path), input="")
    assert out.returncode == 0 and "passed" not in out.stdout


def test_pytest_main_reports_as_pytest_and_skips_the_interpreters_shutdown(tmp_path):
    # a failing test's report and exit code come through; a handler the tests' imports registered
    # for the interpreter's shutdown does not run (the process ends when pytest is done)
    (tmp_path / "test_two.py").write_text(
        "import atexit\n\natexit.register(print, 'SHUTDOWN RAN')\n\n\n"
        "def test_ok():\n    pass\n\n\ndef test_bad():\n    assert 1 == 2\n"
    )
    out = _run("pytest_main", "-q", "-p", "no:cacheprovider", "test_two.py", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed, 1 passed" in out.stdout and "SHUTDOWN RAN" not in out.stdout + out.stderr


def test_profile_runner_without_the_backend(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('never runs')\n")
    result = tmp_path / "profile.json"
    out = _run("profile_runner", str(result), "nodevice", str(script))
    assert out.returncode == 2 and "never runs" not in out.stderr
    assert json.loads(result.read_text()) == {"error": "not_loaded"}


def test_profile_runner_runs_the_script_and_writes_the_counters(tmp_path):
    # a stand-in backend: torch.fakedev with the fallback's counters, set up before the runner starts
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import types, torch\n"
        "torch.fakedev = types.SimpleNamespace(fallback_stats=lambda: {'aten::addcmul.out': (3, 0.25)},\n"
        "                                      reset_fallback_counts=lambda: None)\n"
    )
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "helper.py").write_text("VALUE = 7\n")
    script = tmp_path / "scripts" / "script.py"
    script.write_text("import sys\nimport helper\nprint(helper.VALUE, sys.argv[1:])\nsys.exit(3)\n")
    result = tmp_path / "profile.json"
    out = _run(
        "profile_runner",
        str(result),
        "fakedev",
        str(script),
        "--flag",
        "x",
        env=subprocess_env(autoload="1", pythonpath=site),
        cwd=tmp_path,
    )
    assert out.returncode == 3, out.stderr
    assert out.stdout == "7 ['--flag', 'x']\n"
    data = json.loads(result.read_text())
    assert data["stats"] == {"aten::addcmul.out": [3, 0.25]} and data["status"] == 3 and data["seconds"] >= 0
