"""The library entry points; the CLI is a thin layer over these, and tests call them directly.

    new_backend("mychip", Path("torch-mychip"))      # render, build, test
    add_ops(["aten::mul.Tensor"], Path("torch-mychip"))
    remove_ops(["aten::mul.out"], Path("torch-mychip"))   # kernel, test, registration, record
    build_backend(Path("torch-mychip"))               # rebuild after an edit
    test_backend(Path("torch-mychip"), opinfo=True)   # its tests and the OpInfo conformance suite
    run_pytorch_tests(Path("pytorch/test"), ["test_view_ops.py"], Path("torch-mychip"))  # PyTorch's own tests
    list_ops("mul*", Path("torch-mychip"))
    check(Path("torch-mychip"))                       # accept=True: record the installed torch
    profile(Path("train.py"), ["--epochs", "1"], Path("torch-mychip"))  # what ran on the CPU fallback
    update_project(Path("torch-mychip"))              # carry it to the current template

Each command lives in its module of backendgen.commands; this module only names them.
"""

from __future__ import annotations

from backendgen.commands.addop import AddOpsResult, RemoveOpsResult, add_ops, remove_ops
from backendgen.commands.autocast import AmpRow, AmpSetResult, amp_list, amp_set
from backendgen.commands.building import BuildResult, build_backend, build_wheel
from backendgen.commands.check import check
from backendgen.commands.listing import OpStatus, list_ops
from backendgen.commands.new import NewResult, new_backend
from backendgen.commands.profile import profile
from backendgen.commands.pytorch_suite import run_pytorch_tests
from backendgen.commands.testing import OPT_IN_SUITES, OptInSuite, SuiteRun, TestResult, test_backend
from backendgen.commands.update import update_project

__all__ = [
    "AddOpsResult",
    "AmpRow",
    "AmpSetResult",
    "BuildResult",
    "NewResult",
    "OPT_IN_SUITES",
    "OpStatus",
    "OptInSuite",
    "RemoveOpsResult",
    "SuiteRun",
    "TestResult",
    "add_ops",
    "amp_list",
    "amp_set",
    "build_backend",
    "build_wheel",
    "check",
    "list_ops",
    "new_backend",
    "profile",
    "remove_ops",
    "run_pytorch_tests",
    "test_backend",
    "update_project",
]
