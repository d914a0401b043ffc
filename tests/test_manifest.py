"""The template's manifest (template/template.json, backendgen/project/manifest.py) against the template
and the installed torch: fast, no build. A template change that forgets its manifest entry fails
here, naming what was forgotten, rather than at a user's `backendgen check`."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import patch_integration_point

from backendgen.commands import check
from backendgen.commands.check import check_project
from backendgen.project import contract, manifest
from backendgen.project.on_disk import Project
from backendgen.torchdb import support
from backendgen.torchdb.opdb import load_opdb

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def template_copy(tmp_path) -> Path:
    dest = tmp_path / "template"
    shutil.copytree(manifest.template_dir(), dest)
    return dest


def _edit_manifest(template: Path, change) -> None:
    path = template / manifest.MANIFEST_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _point(data: dict, name: str) -> dict:
    return next(p for p in data["integration_points"] if p["name"] == name)


def test_the_template_keeps_its_manifest():
    assert contract.audit() == []


def test_every_api_the_manifest_names_exists_in_the_installed_torch():
    torch_dir = load_opdb().info.torchgen_dir.parent / "torch"
    assert contract.api_problems(manifest.load(), torch_dir) == []


def test_a_new_source_file_without_a_manifest_entry_is_named(template_copy):
    new = template_copy / contract.PROJECT_DIR / "csrc" / "runtime" / "event_pool.cpp"
    new.write_text('#include "runtime/runtime.h"\n')
    (template_copy / contract.PROJECT_DIR / "{{cookiecutter.package}}" / "tracing.py").write_text("")
    # csrc/runtime/ has no entry of its own; the package folder has one (the device module)
    assert contract.audit(template_copy) == [
        "csrc/runtime/event_pool.cpp: no integration point owns it; add one to template.json (or the file to an entry)"
    ]
    _edit_manifest(
        template_copy,
        lambda d: d["integration_points"].append(
            {"name": "event pool", "paths": ["csrc/runtime/event_pool.cpp"], "about": "", "replace": "no"}
        ),
    )
    assert contract.audit(template_copy) == []


def test_a_registration_the_manifest_does_not_list_is_named(template_copy):
    conv = template_copy / contract.PROJECT_DIR / "csrc" / "aten" / "convolution.cpp"
    text = conv.read_text()
    conv.write_text(
        text.replace(
            '  m.impl("convolution_overrideable"',
            '  m.impl("slow_conv2d_forward", TORCH_FN(f));\n  m.impl("convolution_overrideable"',
        )
    )
    (conv.parent / "fallback.cpp").write_text((conv.parent / "fallback.cpp").read_text() + "\nREGISTER_FOO_HOOK(x);\n")
    assert sorted(contract.audit(template_copy)) == [
        "CPU fallback: static registration REGISTER_FOO_HOOK is not in template.json",
        "convolution: registers aten::slow_conv2d_forward at PrivateUse1, which template.json does not list",
    ]


def test_a_listed_registration_or_api_the_template_lacks_is_named(template_copy):
    def change(d):
        _point(d, "minimal operators")["registers"]["PrivateUse1"].append("aten::fill_.Scalar")
        _point(d, "hooks")["cpp_apis"]["ATen/detail/PrivateUse1HooksInterface.h"].append("getPinnedMemoryAllocatorFor")
        _point(d, "distributed")["defines"].append("{package}::all_to_all")
        _point(d, "profiler")["paths"].append("csrc/runtime/tracer.cpp")

    _edit_manifest(template_copy, change)
    assert sorted(contract.audit(template_copy)) == [
        "distributed: template.json lists the definition of {package}::all_to_all, which its files do not make",
        "hooks: template.json names ATen/detail/PrivateUse1HooksInterface.h: getPinnedMemoryAllocatorFor, "
        "which its files do not use",
        "minimal operators: template.json lists aten::fill_.Scalar at PrivateUse1, which its files do not register",
        "profiler: csrc/runtime/tracer.cpp is in template.json but not in the template",
    ]


def test_kernel_helpers_and_the_setup_protocol_are_held_to_the_manifest(template_copy):
    def change(d):
        provides = _point(d, "kernel support")["provides"]
        provides.remove("StreamScope")
        provides.append("launch_on_stream")

    _edit_manifest(template_copy, change)
    setup = template_copy / contract.PROJECT_DIR / "setup.py"
    setup.write_text(setup.read_text().replace('print("sources:"', 'print("files:"'))
    assert sorted(contract.audit(template_copy)) == [
        "generated code calls kernels::StreamScope, which no integration point provides",
        "kernel support: provides launch_on_stream, which its headers do not declare",
        "setup.py: its `unity` command does not print 'sources:' (template.json build.sources_prefix)",
    ]


def test_only_the_files_the_manifest_lists_may_include_the_emulator_header(template_copy):
    csrc = template_copy / contract.PROJECT_DIR / "csrc"
    kernel = csrc / "aten" / "my_op.cpp"  # a kernel reaching past kernel_support.h
    kernel.write_text('#include "aten/kernel_support.h"\n#include "driver/emulator.h"\n')
    _edit_manifest(
        template_copy,
        lambda d: d["integration_points"].append(
            {"name": "my op", "paths": ["csrc/aten/my_op.cpp"], "about": "", "replace": "no"}
        ),
    )
    problems = contract.audit(template_copy)
    assert problems[0] == (
        'csrc/aten/my_op.cpp: includes "driver/emulator.h" (csrc/driver/emulator.h): outside csrc/driver/ nothing '
        "includes more of the driver than driver/driver.h, the port API"
    )
    assert problems[1:] == [  # a project made with another driver has no emulator.h at all
        'with --driver minimal: csrc/aten/my_op.cpp: includes "driver/emulator.h" (csrc/driver/emulator.h), '
        "which the project lacks"
    ]
    kernel.unlink()
    # a driver file the manifest does not list, a listed user that no longer includes it, a header
    # and a file outside the driver as users, and a kernel template calling it
    (csrc / "driver" / "extra.cpp").write_text('#include "driver/emulator.h"\n')
    streams = csrc / "driver" / "streams.cpp"
    streams.write_text(streams.read_text().replace('#include "driver/emulator.h"\n', ""))
    _edit_manifest(
        template_copy,
        lambda d: d["emulator"]["users"].extend(["csrc/driver/driver.h", "csrc/aten/kernel_support.cpp"]),
    )
    j2 = template_copy / "ops" / "kernel.cpp.j2"
    j2.write_text(j2.read_text() + "// void* p = emulator::host_address(self.data_ptr());\n")
    assert sorted(contract.audit(template_copy)) == [
        "csrc/driver/extra.cpp: includes csrc/driver/emulator.h, the emulator's own calls; only the files "
        "template.json lists in emulator.users may (the rest reach the device through driver.h, kernels through "
        "kernel_support.h)",
        "emulator: csrc/aten/kernel_support.cpp is outside csrc/driver/: the emulator's header is the driver's own",
        "emulator: csrc/driver/driver.h is a header: every file that includes it would reach the emulator",
        "emulator: csrc/driver/streams.cpp is a user in template.json but does not include csrc/driver/emulator.h",
        "ops/kernel.cpp.j2: generated code reaches the emulator (emulator.h or emulator::); generated kernels use "
        "kernels:: helpers (kernel_support.h)",
        'with --driver minimal: csrc/driver/extra.cpp: includes "driver/emulator.h" (csrc/driver/emulator.h), '
        "which the project lacks",
    ]


def test_a_malformed_emulator_entry_is_refused():
    data = manifest.read(manifest.template_dir())
    assert manifest.parse(data).emulator.header == "csrc/driver/emulator.h"
    data["emulator"] = {"header": "csrc/driver/emulator.h", "users": "csrc/python/module.cpp"}
    with pytest.raises(TypeError, match="emulator needs a `header` path and a `users` list"):
        manifest.parse(data)


def test_registrations_are_read_from_the_cpp():
    cpp = textwrap.dedent("""
    // TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("commented_out", f); }
    TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
      m.impl("add.out", TORCH_FN(add_out));  // m.impl("in_a_comment", g);
    }
    TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
      m.fallback(torch::CppFunction::makeFallthrough());
    }
    TORCH_LIBRARY_FRAGMENT({{ cookiecutter.package }}, m) {
      m.def("host_view(Tensor(a) self) -> Tensor(a)", &host_view);
    }
    C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl)
    """)
    assert contract.registrations(cpp) == (
        {"PrivateUse1": {"aten::add.out"}, "AutocastPrivateUse1": {"_::fallback"}},
        {"{package}::host_view"},
        {"C10_REGISTER_GUARD_IMPL"},
    )


def test_the_builtin_operators_exist_in_the_installed_torch():
    db = load_opdb()
    m = manifest.load()
    assert [name for name in (*m.builtin_ops(), *m.default_ops, *m.default_amp) if db.get(name) is None] == []
    assert {"empty.memory_format", "_copy_from", "normal_", "convolution_overrideable"} <= set(m.builtin_ops())


def test_features_are_named_by_the_template_that_introduced_them():
    m = manifest.load()
    assert m.current_features == set(m.features)
    assert "common_device" not in m.features_of(1) and "common_device" in m.features_of(2)
    assert all(1 < f.since <= m.template_version for f in m.features.values())


def test_the_supported_torch_versions_are_written_once():
    m = manifest.load()
    assert support.TESTED == m.torch_tested and support.MINIMUM == m.torch_minimum
    # no module of backendgen spells a tested version itself
    literal = re.compile("|".join(re.escape(f'"{v}"') for v in m.torch_tested))
    assert [p.name for p in (REPO / "backendgen").rglob("*.py") if literal.search(p.read_text())] == []
    # the README says what the manifest says
    readme = (REPO / "README.md").read_text()
    *head, last = m.torch_tested
    assert f"Tested: **torch {', '.join(head)} and {last}**" in readme
    assert f"The minimum is\n{m.torch_minimum}" in readme


def test_the_generated_readme_lists_every_integration_point(rendered_project):
    readme = (rendered_project / "README.md").read_text()
    section = readme[readme.index("## What is where") :]
    table = section[: section.index("\n## ")]  # up to the next section
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    m = manifest.load()
    assert len(rows) == len(m.integration_points)
    package = json.loads((rendered_project / "backendgen.json").read_text())["package"]
    for row, point in zip(rows, m.integration_points, strict=True):
        first = point.paths[0].replace("{package}", package)
        assert row.startswith(f"| `{first}`") and "{" not in row, row


def test_a_source_folder_no_unity_group_compiles_is_named(template_copy):
    new = template_copy / contract.PROJECT_DIR / "csrc" / "collectives" / "ring.cpp"
    new.parent.mkdir()
    new.write_text("")
    _edit_manifest(
        template_copy,
        lambda d: d["integration_points"].append(
            {"name": "ring", "paths": ["csrc/collectives/"], "about": "", "replace": "no"}
        ),
    )
    assert contract.audit(template_copy) == [
        "csrc/collectives/ring.cpp: no unity group in setup.py's GROUPS compiles it"
    ]


def test_check_finds_every_registration_the_manifest_lists_in_the_built_backend(installed):
    """The contract from the dispatcher of a built backend: `check` looks up each operator a point
    registers at its dispatch key, and each one it defines."""
    report = check_project(Project.load(installed))
    assert [f for f in report.findings if f.area == "extension" and f.severity != "ok"] == []
    asked = check._expected_keys(Project.load(installed))
    assert "PrivateUse1" in asked["aten::empty_strided"] and "Conjugate" in asked["aten::_copy_from"]
    assert any(op.endswith("::host_view") for op in asked)


def test_check_names_a_registration_the_built_backend_lacks(installed, monkeypatch):
    patch_integration_point(
        monkeypatch,
        "minimal operators",
        lambda point: {
            "registers": {**point.registers, "PrivateUse1": (*point.registers["PrivateUse1"], "aten::erf.out")}
        },
    )
    [finding] = [
        f for f in check_project(Project.load(installed)).findings if f.area == "extension" and f.severity != "ok"
    ]
    assert finding.subject == "aten::erf.out" and "registers no PrivateUse1 kernel" in finding.message
