"""The fast rebuild (backendgen.toolchain.build.BuildRecord): when ninja and the link alone are exact, and
every change that sends a build back through setup.py. The end-to-end edit loop on a real build is
in test_e2e.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backendgen.toolchain import build, processes

LINK_LINE = (
    "g++ -shared /p/build/temp.linux-x86_64-cpython-311/build/unity/aten.o -L/t/lib -lc10 "
    "-o build/lib.linux-x86_64-cpython-311/pkg/_C.cpython-311-x86_64-linux-gnu.so -Wl,-s"
)


def test_the_link_command_is_read_back_from_the_build_log():
    log = f"running build_ext\n[1/1] c++ -c x.cpp -o x.o\n{LINK_LINE}\ncopying build/lib... -> pkg\n"
    assert build._link_command(log) == LINK_LINE.split()


@pytest.mark.parametrize(
    "line",
    [
        LINK_LINE.replace("/p/", '"/p q/'),
        LINK_LINE.replace("-o build/lib", "-o build\\lib"),
        LINK_LINE.replace(".so", ".o"),
    ],
)
def test_a_link_line_that_may_not_split_back_exactly_is_not_recorded(line):
    assert build._link_command(line) is None


@pytest.fixture
def recorded(rendered_project, tmp_path):
    """A rendered project with a build record that matches it as it is now."""
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    ninja = root / "build" / "temp.linux-x86_64-cpython-311" / "build.ninja"
    ninja.parent.mkdir(parents=True)
    ninja.write_text("rule compile\n")
    log = root / "build" / "backendgen-build.log"
    log.write_text(LINK_LINE.replace("/p/", f"{root}/") + "\n")
    env = processes.build_env()
    record = build.BuildRecord.from_log(root, log, build._csrc_files(root), env)
    assert record is not None and record.stale_because(root, env) is None
    return root, env


def test_a_pip_build_is_recorded_with_its_link_moved_into_the_project(recorded):
    # pip links into a temporary directory that it deletes; the recorded link writes where setup.py's does
    root, env = recorded
    log = root / "build" / "backendgen-build.log"
    log.write_text(
        "  "
        + LINK_LINE.replace("/p/", f"{root}/").replace(
            "-o build/lib.linux-x86_64-cpython-311", "-o /tmp/tmpab12.build-lib"
        )
        + "\n"
    )
    record = build.BuildRecord.from_log(root, log, build._csrc_files(root), env)
    assert record.library == str(root / "build/lib.linux-x86_64-cpython-311/pkg/_C.cpython-311-x86_64-linux-gnu.so")
    assert build.BuildRecord.load(root).data["link"] == record.data["link"]


def test_a_build_that_compiled_outside_the_project_is_not_recorded(recorded):
    # pip with a template-3 setup.py compiles in a temporary directory; an older build/temp.* in the
    # project is not what it linked
    root, env = recorded
    log = root / "build" / "backendgen-build.log"
    log.write_text(LINK_LINE.replace("/p/build/temp.linux-x86_64-cpython-311", "/tmp/tmpcd34.build-temp") + "\n")
    assert build.BuildRecord.from_log(root, log, build._csrc_files(root), env) is None


def test_an_edited_source_keeps_the_fast_path(recorded):
    root, env = recorded
    kernel = root / "csrc" / "aten" / "ops" / "mul.cpp"
    kernel.write_text(kernel.read_text() + "\n// tuned\n")
    (root / "csrc" / "aten" / "kernel_support.h").write_text("// a header edit is ninja's business\n")
    assert build.BuildRecord.load(root).stale_because(root, env) is None


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda root, env: (root / "csrc" / "aten" / "ops" / "extra.cpp").write_text("// new\n"),
            "a source file was added or removed",
        ),
        (lambda root, env: (root / "csrc" / "aten" / "ops" / "mul.cpp").unlink(), "a source file was added or removed"),
        (
            lambda root, env: (root / "setup.py").write_text((root / "setup.py").read_text() + "\n# edited\n"),
            "setup.py, pyproject.toml or sdk.cfg changed",
        ),
        (
            lambda root, env: (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "\n"),
            "setup.py, pyproject.toml or sdk.cfg changed",
        ),
        (lambda root, env: env.update(CXX="clang++"), "compiler settings in the environment changed"),
        (lambda root, env: env.update(MYCHIP_UNITY_BUILD="0"), "compiler settings in the environment changed"),
        (
            lambda root, env: (root / "sdk.cfg").write_text("[sdk]\nlibraries = mysdk\n"),
            "setup.py, pyproject.toml or sdk.cfg changed",
        ),
        (lambda root, env: env.update(MYCHIP_SDK_LIBRARIES="mysdk"), "compiler settings in the environment changed"),
        (
            lambda root, env: next(root.glob("build/temp.*/build.ninja")).write_text("rule other\n"),
            "build.ninja changed",
        ),
    ],
)
def test_a_change_to_what_shapes_the_build_sends_it_through_setup_py(recorded, change, why):
    root, env = recorded
    env = dict(env)
    change(root, env)
    assert build.BuildRecord.load(root).stale_because(root, env) == why


def test_another_torch_or_a_moved_project_sends_it_through_setup_py(recorded, monkeypatch, tmp_path):
    root, env = recorded
    monkeypatch.setattr(build, "_torch_install", lambda: {"version": "2.14.1", "dir": "/elsewhere/torch"})
    assert build.BuildRecord.load(root).stale_because(root, env) == "torch changed"
    monkeypatch.undo()
    moved = tmp_path / "moved"
    shutil.move(root, moved)
    assert build.BuildRecord.load(moved).stale_because(moved, env) == "the project moved"


def test_a_record_from_another_format_is_ignored(recorded):
    root, _ = recorded
    path = root / build.RECORD
    path.write_text(path.read_text().replace('"format": 1', '"format": 99'))
    assert build.BuildRecord.load(root) is None
    path.write_text("{ not json")
    assert build.BuildRecord.load(root) is None


@pytest.fixture
def with_units(recorded):
    """`recorded`, with a build.ninja that compiles the unity files setup.py lists (as a real one does)."""
    root, env = recorded
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "unity"], cwd=root, capture_output=True, text=True, check=True
    )
    sources = json.loads(out.stdout.split("sources: ", 1)[1])
    ninja = next(root.glob("build/temp.*/build.ninja"))
    ninja.write_text("".join(f"build {ninja.parent}/{s}.o: compile {root / s}\n" for s in sources))
    record = build.BuildRecord.from_log(root, root / "build" / "backendgen-build.log", build._csrc_files(root), env)
    return root, env, record


def test_a_new_kernel_file_joins_its_unity_file_without_setup_py(with_units):
    root, env, record = with_units
    (root / "csrc" / "aten" / "ops" / "extra.cpp").write_text("// a kernel add-op wrote\n")
    assert record.stale_because(root, env) is build.Stale.SOURCES
    assert record.units_still_match(root, env)
    # it joins exactly one of the ops group's shards (the one its path hashes to), every shard kept
    shards = sorted((root / "build" / "unity").glob("ops-*.cpp"))
    assert len(shards) == 4 and sum("csrc/aten/ops/extra.cpp" in s.read_text() for s in shards) == 1
    assert build.BuildRecord.load(root).stale_because(root, env) is None  # the record now lists it


def test_sources_that_need_a_new_build_ninja_go_through_setup_py(with_units):
    root, env, record = with_units
    for path in (root / "csrc" / "python").glob("*.cpp"):  # a whole unit disappears
        path.unlink()
    assert not record.units_still_match(root, env)
    assert not (root / "build" / "unity" / "python.cpp").exists()  # never compiled stale
    assert build.BuildRecord.load(root).stale_because(root, env) is build.Stale.SOURCES
    # one file per translation unit: every new file is a new ninja target
    (root / "csrc" / "aten" / "ops" / "extra.cpp").write_text("// new\n")
    device = json.loads((root / "backendgen.json").read_text())["DEVICE"]
    unity_off = dict(env, **{f"{device}_UNITY_BUILD": "0"})
    assert not record.units_still_match(root, unity_off)


def test_a_copy_of_a_project_compiles_to_the_same_ccache_keys(with_units, tmp_path):
    """ccache serves a copied or moved project (CI workspaces, a team's second checkout): the unity
    files include their sources by relative path, and the build tells ccache the project's root."""
    root, _, _ = with_units
    for unit in (root / "build" / "unity").glob("*.cpp"):
        includes = [ln for ln in unit.read_text().splitlines() if ln.startswith("#include")]
        # the kernels' unit first includes their precompiled header by its name on the include path
        own = [ln for ln in includes if not ln.startswith('#include "aten/kernel_support.h"')]
        assert own and all('"../../csrc/' in ln for ln in own), includes
    assert processes.build_env(root=root)["CCACHE_BASEDIR"] == str(root.resolve())


def _precompile(root, env):
    """setup.py's precompile_headers on the project's build.ninja, as its build_ext runs it."""
    ninja = next(root.glob("build/temp.*/build.ninja"))
    code = (
        "import runpy, sys; from pathlib import Path; sys.argv = ['setup.py', '--name']; "
        f"runpy.run_path('setup.py')['precompile_headers'](Path({str(ninja)!r}))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    return ninja.read_text()


@pytest.fixture
def torch_like_ninja(with_units):
    """`with_units`, its build.ninja written as torch writes one: the compiler, the flags (build/pch
    first on the include path, as setup.py puts it), the compile rule, then a line per unit."""
    import torch.utils.cpp_extension

    root, env, record = with_units
    ninja = next(root.glob("build/temp.*/build.ninja"))
    dirs = [root / "build" / "pch", root / "csrc", *map(Path, torch.utils.cpp_extension.include_paths())]
    header = "cxx = c++\ncflags = " + " ".join(f"-I{d}" for d in dirs) + " -c\npost_cflags = -O2 -std=c++20\n"
    header += "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n"
    ninja.write_text(header + "\n" + ninja.read_text())
    return root, env, record


def test_the_units_that_include_a_precompiled_header_first_depend_on_it(torch_like_ninja):
    root, env, record = torch_like_ninja
    if not shutil.which("c++") or "Free Software Foundation" not in subprocess.getoutput("c++ --version"):
        pytest.skip("precompiled headers are made with GCC only")
    text = _precompile(root, env)
    pch = root / "build" / "pch"
    units = {
        str(Path(src).relative_to(root).with_suffix("")): rest
        for src, rest in re.findall(r"^build \S+: compile (\S+)(.*)$", text, re.MULTILINE)
    }
    kernels, library = f" | {pch}/aten/kernel_support.h.gch", f" | {pch}/torch/library.h.gch"
    # the units add-op and a kernel's edit recompile: the ops group's shards, every one written
    shards = sorted(u for u in units if u.startswith("build/unity/ops"))
    assert shards == [f"build/unity/ops-{i}" for i in range(4)] and {units[u] for u in shards} == {kernels}
    assert units["csrc/aten/ops/generated/registration"] == library
    assert units["csrc/aten/ops/generated/registration_added"] == library
    # the aten unit, a first build's long pole, does not wait for one; the driver has no torch header
    assert units["build/unity/aten"] == "" and units["csrc/driver/driver"] == ""
    assert f"build {pch}/aten/kernel_support.h.gch: precompile {root}/csrc/aten/kernel_support.h" in text
    assert "\nrule precompile\n  command = $cxx -MMD -MF $out.d $cflags -x c++-header $in" in text
    # each .gch has its header beside it, for the units' later #include of it
    assert (pch / "aten" / "kernel_support.h").resolve() == root / "csrc" / "aten" / "kernel_support.h"
    assert (pch / "torch" / "library.h").resolve().is_file()
    # ninja's file still compiles what setup.py lists: an added kernel keeps the fast path
    (root / "csrc" / "aten" / "ops" / "extra.cpp").write_text("// a kernel add-op wrote\n")
    assert record.units_still_match(root, env)


def test_without_precompiled_headers_no_unit_can_read_an_old_one(torch_like_ninja):
    root, env, _ = torch_like_ninja
    stale = root / "build" / "pch" / "aten" / "kernel_support.h.gch"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier build's")
    ninja = next(root.glob("build/temp.*/build.ninja"))
    before = ninja.read_text()
    device = json.loads((root / "backendgen.json").read_text())["DEVICE"]
    assert _precompile(root, dict(env, **{f"{device}_PRECOMPILED_HEADERS": "0"})) == before
    assert not stale.parent.parent.exists()


def test_ccache_is_told_to_cache_the_precompiled_headers(monkeypatch, tmp_path):
    monkeypatch.setenv("CCACHE_SLOPPINESS", "file_macro,time_macros")
    monkeypatch.setattr(processes, "ccache_dir", lambda: tmp_path)
    assert processes.build_env()["CCACHE_SLOPPINESS"] == "file_macro,time_macros,pch_defines"


def test_a_setup_py_without_the_unity_command_goes_through_setup_py(with_units):
    root, env, record = with_units
    setup_py = root / "setup.py"
    setup_py.write_text(setup_py.read_text().replace('cmdclass={"unity": WriteUnits},', ""))
    (root / "csrc" / "aten" / "ops" / "extra.cpp").write_text("// new\n")
    assert not record.units_still_match(root, env)


def test_a_file_a_unity_group_names_is_compiled_in_that_group_only(with_units):
    # the profiler's Kineto headers stay out of the runtime unit; other runtime files still join it
    root, env, record = with_units
    unity = root / "build" / "unity"
    assert "csrc/runtime/profiler.cpp" in (unity / "profiler.cpp").read_text()
    assert "profiler.cpp" not in (unity / "runtime.cpp").read_text()
    assert "csrc/runtime/guard.cpp" in (unity / "runtime.cpp").read_text()
    (root / "csrc" / "runtime" / "extra.cpp").write_text("// a runtime file a team added\n")
    assert record.units_still_match(root, env)
    assert "csrc/runtime/extra.cpp" in (unity / "runtime.cpp").read_text()
    device = json.loads((root / "backendgen.json").read_text())["DEVICE"]
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "unity"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        env=dict(env, **{f"{device}_UNITY_BUILD": "0"}),
    )
    files = json.loads(out.stdout.split("sources: ", 1)[1])
    assert files.count("csrc/runtime/profiler.cpp") == 1 and "csrc/runtime/extra.cpp" in files


def test_a_build_whose_compiler_died_of_ctrl_c_is_an_interrupt_however_much_pip_prints_after(tmp_path):
    log = tmp_path / "backendgen-build.log"
    died = "subprocess.CalledProcessError: Command '['ninja', '-v', '-j', '2']' returned non-zero exit status 130.\n"
    log.write_text("building\n" + died + "  pip's notes after the traceback\n" * 400)
    failed = subprocess.CompletedProcess(["pip"], 1)
    with pytest.raises(KeyboardInterrupt):
        build._raise_if_failed(failed, log)
    log.write_text("building\nerror: no member named 'foo'\n" + "  pip's notes\n" * 400)
    with pytest.raises(build.BuildError):
        build._raise_if_failed(failed, log)
