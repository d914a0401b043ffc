"""The port kit of every generated project, checked without building: the porting guide rendered
with the project's names (and docs/porting.md, the same guide for `mychip`), setup.py's SDK paths
and the driver's own translation units, and the capability marks of the generated tests."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backendgen.project import portdoc
from backendgen.toolchain import build


def _names(project: Path) -> dict:
    return json.loads((project / "backendgen.json").read_text())


def test_docs_porting_md_is_the_projects_guide_rendered_for_mychip():
    if portdoc.DOC.read_text() != portdoc.render():
        pytest.fail(f"docs/porting.md is not the template's guide rendered; regenerate it: {portdoc.REGENERATE}")


def test_a_new_project_has_the_porting_guide_with_its_names(rendered_project):
    meta = _names(rendered_project)
    text = (rendered_project / "docs" / "porting.md").read_text()
    assert text == portdoc.render(meta["device"])
    assert f"torch.{meta['device']}.capabilities()" in text and f"{meta['DEVICE']}_SDK_LIBRARIES" in text
    assert "mychip" not in text and "{{" not in text and "{%" not in text


# ---- setup.py: the SDK's paths --------------------------------------------------------------------

_EXTENSION = (
    "import json, runpy, setuptools\n"
    "setuptools.setup = lambda **kw: None\n"  # the module's functions, without a build
    "print(json.dumps(runpy.run_path('setup.py')['extension'](['/kineto'])))\n"
)


@pytest.fixture
def setup_py(rendered_project, tmp_path) -> tuple[Path, str]:
    """The project's setup.py alone in a directory (its root), and the environment prefix."""
    shutil.copy(rendered_project / "setup.py", tmp_path / "setup.py")
    return tmp_path, _names(rendered_project)["DEVICE"]


def _extension(root: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if "_SDK_" not in k} | variables
    return subprocess.run(
        [sys.executable, "-c", _EXTENSION], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def _args(root: Path, **variables: str) -> dict:
    ran = _extension(root, **variables)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def _own_dirs(root: Path) -> list[str]:
    """The project's own include directories, before any SDK's: its precompiled headers, then csrc."""
    return [str(root / "build" / "pch"), str(root / "csrc")]


def test_without_an_sdk_the_extension_has_no_sdk_paths(setup_py):
    root, _ = setup_py
    ext = _args(root)
    assert ext["include_dirs"] == [*_own_dirs(root), "/kineto"]
    assert ext["library_dirs"] == ext["runtime_library_dirs"] == ext["libraries"] == []


def test_setup_py_takes_the_sdk_paths_from_sdk_cfg_and_the_environment(setup_py):
    root, prefix = setup_py
    (root / "sdk.cfg").write_text(
        "[sdk]\n"
        "include_dirs = sdk/include\n    /opt/sdk/include\n"  # one a line
        "library_dirs = /opt/sdk/lib\n"
        "libraries = mysdk, mysdk_rt\n"
    )
    ext = _args(root)
    assert ext["include_dirs"] == [*_own_dirs(root), str(root / "sdk" / "include"), "/opt/sdk/include", "/kineto"]
    assert ext["library_dirs"] == ext["runtime_library_dirs"] == ["/opt/sdk/lib"]  # the run-time path too
    assert ext["libraries"] == ["mysdk", "mysdk_rt"]
    # a variable that is set wins over the file's line, even empty; the others still come from the file
    ext = _args(
        root,
        **{
            f"{prefix}_SDK_INCLUDE_DIRS": os.pathsep.join(["/env/a", "/env/b"]),
            f"{prefix}_SDK_LIBRARIES": "other other_rt",
            f"{prefix}_SDK_LIBRARY_DIRS": "",
        },
    )
    assert ext["include_dirs"] == [*_own_dirs(root), "/env/a", "/env/b", "/kineto"]
    assert ext["libraries"] == ["other", "other_rt"]
    assert ext["library_dirs"] == ext["runtime_library_dirs"] == []


def test_an_unknown_key_in_sdk_cfg_is_named(setup_py):
    root, _ = setup_py
    (root / "sdk.cfg").write_text("[sdk]\ninclude_dir = /opt/sdk/include\n")
    ran = _extension(root)
    assert ran.returncode != 0 and "include_dir" in ran.stderr and "include_dirs" in ran.stderr, ran.stderr


def test_the_sdk_paths_and_sdk_cfg_shape_the_build_record():
    # backendgen build's fast path skips setup.py: a change of either must send the build through it
    env = {"MYCHIP_SDK_INCLUDE_DIRS": "/i", "MYCHIP_SDK_LIBRARY_DIRS": "/l", "MYCHIP_SDK_LIBRARIES": "x", "HOME": "/h"}
    assert build._build_env(env) == {k: v for k, v in env.items() if k != "HOME"}
    assert "sdk.cfg" in build._INPUTS


# ---- setup.py: the driver's files are translation units of their own ------------------------------


def _sources(root: Path, **variables: str) -> list[str]:
    ran = subprocess.run(
        [sys.executable, "setup.py", "-q", "unity"],
        cwd=root,
        env=os.environ | variables,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(ran.stdout.split("sources: ", 1)[1])


def test_each_driver_file_is_a_translation_unit_of_its_own(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root, symlinks=True)
    sources = _sources(root)
    assert {"csrc/driver/driver.cpp", "csrc/driver/streams.cpp"} <= set(sources)  # the emulator's two
    units = list((root / "build" / "unity").glob("*.cpp"))
    assert units and not any("/driver/" in u.read_text() for u in units)  # in no unit with the runtime
    assert "csrc/runtime/guard.cpp" in (root / "build" / "unity" / "runtime.cpp").read_text()
    # the minimal driver's layout: driver.cpp alone
    (root / "csrc" / "driver" / "streams.cpp").unlink()
    (root / "csrc" / "driver" / "emulator.h").unlink()
    assert [s for s in _sources(root) if "driver" in s] == ["csrc/driver/driver.cpp"]
    # every file on its own: each once
    alone = _sources(root, **{f"{_names(root)['DEVICE']}_UNITY_BUILD": "0"})
    assert alone.count("csrc/driver/driver.cpp") == 1 and len(alone) == len(set(alone))


# ---- the generated tests: a test that uses a capability's test aid is marked with it -------------

# what a test calls -> the capability (driver.h) it needs
_AIDS = {"_sleep": "spin", "set_memory_limit": "memory_limit", "host_view": "host_mapping"}


def _required(decorators: list[ast.expr]) -> set[str]:
    """The capabilities `requires(...)` marks among `decorators` (or a module's pytestmark) name."""
    out = set()
    for d in decorators:
        for node in ast.walk(d):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "requires":
                out |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return out


def _unmarked(path: Path, tests: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    module = _required([n.value for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n)])

    def uses(name: str, seen: frozenset = frozenset()) -> set[str]:
        """The capabilities function `name` needs, through the module's functions it calls."""
        out = set()
        for node in ast.walk(functions[name]):
            called = getattr(node, "attr", None) or getattr(node, "id", None)
            if called in _AIDS:
                out.add(_AIDS[called])
            elif called in functions and called not in seen and called != name:
                out |= uses(called, seen | {name})
        return out

    return [
        f"{path.relative_to(tests)}::{name}: needs {sorted(missing)}"
        for name, f in functions.items()
        if name.startswith("test_") and (missing := uses(name) - _required(f.decorator_list) - module)
    ]


def test_generated_tests_that_use_a_capabilitys_aid_are_marked_with_it(rendered_project):
    tests = rendered_project / "tests"
    files = sorted(tests.rglob("test_*.py"))
    assert len(files) > 10
    unmarked = [u for path in files for u in _unmarked(path, tests)]
    assert not unmarked, "mark them with tests.conftest.requires(...):\n" + "\n".join(unmarked)
