"""`backendgen check` on real projects whose metadata or build has been made wrong in each way."""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import run_cli

from backendgen.commands.check import check_project
from backendgen.project.on_disk import Project


def _edit_metadata(root, fn):
    path = root / "backendgen.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2))


def _op(data, name):
    return next(d for d in data["ops"] if d["op"] == name)


def _pretend_drift(data):
    data["torch"]["native_functions_sha256"] = "0" * 64  # the yaml changed: compare every schema


def _findings(report, area, subject=None):
    return [f for f in report.findings if f.area == area and (subject is None or f.subject == subject)]


def test_clean_project_passes(built_project):
    report = check_project(Project.load(built_project))
    assert report.exit_code == 0, [f for f in report.findings if f.severity == "error"]
    # not even a warning: every kernel is registered where backendgen put it
    assert [f for f in report.findings if f.severity == "warning"] == []
    assert {f.area for f in report.findings} == {"versions", "schema", "api", "extension", "coverage"}
    assert report.coverage["native"] >= 20 and report.coverage["required"] > 500
    c = report.coverage
    assert c["native"] + c["fallback"] + c["no_cpu_kernel"] == c["required"] and c["no_cpu_kernel"] > 0


def test_ops_lists_the_template_native_cells_apart_from_those_with_no_cpu_kernel(built_project):
    report = check_project(Project.load(built_project), list_ops=True)
    c = report.coverage
    assert "aten::_thnn_fused_lstm_cell" in c["native_ops"] and "aten::_thnn_fused_gru_cell_backward" in c["native_ops"]
    assert "aten::cudnn_convolution" in c["no_cpu_kernel_ops"] and "aten::cudnn_convolution" not in c["fallback_ops"]
    assert "aten::sin.out" in c["fallback_ops"]


def test_drifted_yaml_with_identical_schemas_is_clean(project_copy):
    _edit_metadata(project_copy, _pretend_drift)
    report = check_project(Project.load(project_copy))
    kinds = {f.detail.get("kind") for f in _findings(report, "schema")}
    assert kinds == {"unchanged"}
    assert report.exit_code == 0


def test_each_kind_of_schema_drift(project_copy):
    def drift(data):
        _pretend_drift(data)
        # a changed default: the C++ signature stays the same
        add = _op(data, "aten::add.out")
        add["schema"] = add["schema"].replace("Scalar alpha=1", "Scalar alpha=2")
        # an argument the kernel does not have (the installed torch added `other`)
        mul = _op(data, "aten::mul.out")
        mul["schema"] = "aten::mul.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)"
        mul["signature"] = "at::Tensor & mul_out_out(const at::Tensor & self, at::Tensor & out)"
        # SymInt -> int: FunctionSchema == calls these equal; the canonical strings do not
        es = _op(data, "aten::empty_strided")
        es["schema"] = es["schema"].replace("SymInt[] size, SymInt[] stride", "int[] size, int[] stride")
        es["signature"] = es["signature"].replace("c10::SymIntArrayRef", "at::IntArrayRef")
        # an operator that no longer exists (renamed)
        view = _op(data, "aten::view")
        view["op"] = "aten::vew"
        view["schema"] = view["schema"].replace("aten::view", "aten::vew")

    _edit_metadata(project_copy, drift)
    report = check_project(Project.load(project_copy))
    by_op = {f.subject: f for f in _findings(report, "schema")}
    assert by_op["aten::add.out"].detail["kind"] == "schema_changed"
    assert by_op["aten::add.out"].severity == "warning"
    assert by_op["aten::mul.out"].detail["kind"] == "signature_changed"
    assert "const at::Tensor & other" in by_op["aten::mul.out"].detail["new_signature"]
    assert by_op["aten::empty_strided"].detail["kind"] == "signature_changed"
    assert "SymInt[] size" in by_op["aten::empty_strided"].detail["new"]
    assert by_op["aten::vew"].detail["kind"] == "removed"
    assert "view" in by_op["aten::vew"].detail["close_matches"]
    assert report.exit_code == 1

    out = run_cli("check", "--project", str(project_copy), "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["errors"] == report.errors


def test_warnings_fail_only_with_strict(project_copy):
    def drift(data):
        _pretend_drift(data)
        add = _op(data, "aten::add.out")
        add["schema"] = add["schema"].replace("Scalar alpha=1", "Scalar alpha=2")

    _edit_metadata(project_copy, drift)
    assert check_project(Project.load(project_copy)).exit_code == 0
    assert check_project(Project.load(project_copy), strict=True).exit_code == 1


def test_op_recorded_but_not_registered(project_copy):
    def extra(data):
        data["ops"].append(
            {
                "op": "aten::sin.out",
                "schema": "aten::sin.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)",
                "signature": "x",
                "source": "csrc/aten/ops/sin.cpp",
                "origin": "add-op",
            }
        )

    _edit_metadata(project_copy, extra)
    report = check_project(Project.load(project_copy))
    [f] = _findings(report, "extension", "aten::sin.out")
    assert f.detail["kind"] == "missing_kernel" and report.exit_code == 1


def _extension(root):
    pkg = json.loads((root / "backendgen.json").read_text())["package"]
    [so] = (root / pkg).glob("_C*.so")
    return so


def test_extension_built_against_another_torch(project_copy, tmp_path):
    """A library that needs a symbol the installed torch does not export, as a stale build does."""
    src = tmp_path / "stale.c"
    src.write_text(
        "extern void at_symbol_from_another_torch(void);\nvoid PyInit__C(void) { at_symbol_from_another_torch(); }\n"
    )
    so = _extension(project_copy)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    report = check_project(Project.load(project_copy))
    errors = [f for f in _findings(report, "extension") if f.severity == "error"]
    assert errors and errors[0].detail.get("kind") == "abi" and "rebuild" in errors[0].message
    assert report.exit_code == 1


def test_corrupted_extension(project_copy):
    so = _extension(project_copy)
    so.write_bytes(b"not a shared library")
    report = check_project(Project.load(project_copy))
    [f] = [f for f in _findings(report, "extension") if f.severity == "error"]
    assert f.detail.get("kind") == "load" and "rebuild" in f.message


def test_truncated_extension_that_kills_the_loading_process(project_copy):
    so = _extension(project_copy)
    so.write_bytes(so.read_bytes()[:4096])
    report = check_project(Project.load(project_copy))  # check itself survives
    [f] = [f for f in _findings(report, "extension") if f.severity == "error"]
    assert f.detail.get("kind") in ("crash", "load") and "rebuild" in f.message


# What torch 2.13 printed when a kernel registered with the wrong C++ type aborted the process that
# loaded it (docs/troubleshooting.md), stack frames shortened.
_MISMATCH_ABORT = """terminate called after throwing an instance of 'c10::Error'
  what():  
Mismatch in kernel C++ signatures
  operator: aten::abs(Tensor self) -> Tensor
    registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSchema.cpp:6
  kernel 1: at::Tensor (at::Tensor const&)
    dispatch key: Batched
    registered at /__w/pytorch/pytorch/aten/src/ATen/LegacyBatchingRegistrations.cpp:1076
  kernel 2: at::Tensor (at::Tensor const&, long)
    dispatch key: PrivateUse1
    registered at /src/csrc/aten/my_abs.cpp:6

Exception raised from registerKernel at /__w/pytorch/pytorch/aten/src/ATen/core/dispatch/OperatorEntry.cpp:174 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x52 (0x7f0 in /venv/lib/libc10.so)
<omitting python frames>
frame #61: __libc_start_main + 0x85 (0x7ff25cc45305 in /lib/x86_64-linux-gnu/libc.so.6)
"""


def test_abort_at_load_names_the_error_not_the_stack(project_copy, tmp_path):
    """An extension whose static registration aborts the process: the finding quotes the error's
    first line and its last lines (the kernel, its file and line), not C++ stack frames."""
    src = tmp_path / "abort.c"
    text = json.dumps(_MISMATCH_ABORT)  # a valid C string literal too
    src.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n"
        f"__attribute__((constructor)) static void registration(void) {{ fputs({text}, stderr); abort(); }}\n"
        "void PyInit__C(void) {}\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(_extension(project_copy)), str(src)], check=True)
    report = check_project(Project.load(project_copy))
    [f] = [f for f in _findings(report, "extension") if f.severity == "error"]
    assert f.detail.get("kind") == "crash" and "SIGABRT" in f.message
    assert (
        "Mismatch in kernel C++ signatures | kernel 2: at::Tensor (at::Tensor const&, long) | "
        "dispatch key: PrivateUse1 | registered at /src/csrc/aten/my_abs.cpp:6"
    ) in f.message, f.message
    assert "frame #" not in f.message


def test_not_built(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    out = run_cli("check", "--project", str(root))
    assert out.returncode == 1
    assert "not built" in out.stdout


def test_renamed_argument_keeps_the_kernel_signature():
    """2.13 -> 2.14 renamed _cdist_backward's `grad` to `grad_output`: the kernel still fits."""
    from backendgen.torchdb.drift import signature_types

    old = "at::Tensor _cdist_backward(const at::Tensor & grad, const at::Tensor & x1, double p)"
    new = "at::Tensor _cdist_backward(const at::Tensor & grad_output, const at::Tensor & x1, double p)"
    assert signature_types(old) == signature_types(new)
    assert signature_types(old) != signature_types(old.replace("double p", "c10::SymInt p"))


def test_drift_is_classified_once_for_check_and_update():
    from backendgen.torchdb.drift import Drift, argument_names, classify
    from backendgen.torchdb.opdb import load_opdb

    op = load_opdb().resolve("topk")
    renamed = op.signature.replace(" k,", " kk,")
    retyped = op.signature.replace("c10::SymInt k", "int64_t k")
    assert retyped != op.signature and renamed != op.signature
    assert classify(op.signature, None, schema_unchanged=False) is Drift.REMOVED
    assert classify(op.signature, op, schema_unchanged=True) is Drift.UNCHANGED
    assert classify(renamed, op, schema_unchanged=False) is Drift.SCHEMA_CHANGED
    assert classify(retyped, op, schema_unchanged=False) is Drift.SIGNATURE_CHANGED
    assert argument_names(renamed)[:2] == ["self", "kk"] and argument_names("void f()") == []


def test_device_module_attribute_torch_reads_is_named_when_missing(project_copy):
    # torch.utils.checkpoint reads `_initialized`, FSDP `memory_summary`: without them training is
    # silently wrong (dropout redrawn) or fails late. check names the attribute and where torch reads it.
    clean = check_project(Project.load(project_copy))
    assert [f for f in _findings(clean, "api") if f.detail.get("kind") == "device_module"] == []
    pkg = json.loads((project_copy / "backendgen.json").read_text())["package"]
    module = project_copy / pkg / "device_module.py"
    module.write_text(module.read_text().replace("def memory_summary(", "def _renamed_away(", 1))
    report = check_project(Project.load(project_copy))
    missing = [f for f in _findings(report, "api") if f.detail.get("kind") == "device_module"]
    assert [f.subject.rsplit(".", 1)[-1] for f in missing] == ["memory_summary"]
    assert "fsdp" in missing[0].message and missing[0].severity == "error"
    assert report.exit_code == 1


def test_device_module_reads_found_in_torch_sources():
    from backendgen.plumbing.environment import installed_torch
    from backendgen.project import devmodule, manifest

    torch = installed_torch()
    reads = devmodule.scan(torch.torch_dir)
    # the reads behind real bugs: checkpointing's RNG flag, AOTAutograd's generator, serialization's index
    assert {"_initialized", "_get_generator", "default_generators", "_utils._get_device_index"} <= set(reads)
    assert any(w.startswith("utils/checkpoint.py:") for w in reads["_initialized"])
    m = manifest.load()
    # everything the installed torch reads is either provided by the template or explained
    unexplained = set(devmodule.required(reads, m.device_module_not_needed)) - set(m.device_module_provides)
    assert unexplained == set()


def test_where_a_kernel_was_registered_is_read_absolute_or_relative_to_the_build(rendered_project):
    """A build served by ccache (the project as its base directory) records source paths relative to
    the compiler's directory; either form must name the project's registration file or the kernel's."""
    from backendgen.commands import check as check_module
    from backendgen.project.on_disk import Project

    project = Project.load(rendered_project)
    source = "csrc/aten/ops/abs.cpp"
    assert check_module._registered_here(
        "PrivateUse1: fn [kernel] registered at ../unity/../../csrc/aten/ops/generated/registration.cpp:12",
        project,
        source,
    )
    assert check_module._registered_here(
        f"PrivateUse1: fn [kernel] registered at ../unity/../../{source}:3", project, source
    )
    assert not check_module._registered_here(
        "PrivateUse1: fn [kernel] registered at ../unity/../../csrc/aten/other.cpp:3", project, source
    )
    assert check_module._registered_here(
        f"PrivateUse1: fn [kernel] registered at {rendered_project / source}:3", project, source
    )
    assert not check_module._registered_here(
        f"PrivateUse1: fn [kernel] registered at /elsewhere/{source}:3", project, source
    )
