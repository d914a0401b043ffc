"""The autocast table: which policy torch.autocast("<device>") applies to each operator.

It lives in backendgen.json (`"amp": {"mm": "lower_precision_fp", ...}`, seeded from
template/template.json's `default_amp`) and the generated registration file registers it at
AutocastPrivateUse1, each entry with a policy kernel of csrc/aten/autocast.cpp. Projects whose
template has the manifest's feature `amp_table` have it; older ones keep their lists in autocast.cpp.
"""

from __future__ import annotations

from backendgen.plumbing.errors import ProjectError, UserError
from backendgen.project import manifest

# PyTorch's CastPolicy names (ATen/autocast_mode.h); "none" removes an operator from the table.
POLICIES = {
    "lower_precision_fp": "floating-point arguments in the autocast dtype "
    "(float16 unless torch.autocast is given another, as PyTorch defaults for PrivateUse1)",
    "fp32": "floating-point arguments in float32",
    "promote": "floating-point arguments in the widest floating-point type among them",
    "fp32_set_opt_dtype": "dtype=float32 when not given (operators with a dtype argument); else as fp32",
    "none": "not in the table: the operator runs in the dtypes it is given",
}


def check_supported(template_version: int) -> None:
    tpl = manifest.load()
    if "amp_table" not in tpl.features_of(template_version):
        raise ProjectError(
            f"this project is from template {template_version}: its autocast table is the list in "
            f"csrc/aten/autocast.cpp (edit it there); `backendgen amp` needs template "
            f"{tpl.feature('amp_table').since} or newer: run backendgen update"
        )


def check_policy(policy: str) -> str:
    p = policy.strip().lower()
    if p not in POLICIES:
        raise UserError(f"unknown autocast policy {policy[:40]!r}: one of {', '.join(POLICIES)}")
    return p


def entries(table: dict) -> list[tuple[str, str]]:
    """The table's (operator, policy) pairs in registration order, without "none"."""
    return sorted((name, policy) for name, policy in table.items() if policy in POLICIES and policy != "none")
