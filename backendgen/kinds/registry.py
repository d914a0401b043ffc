"""The operator kinds a project can register, in the order add-op writes and check reports them. Each
name add-op or remove-op is given goes to the first kind that claims it (kinds.kind.OperatorKind.claims).
A new kind is a module with a `KIND` and a line here (docs/architecture.md, "How to add an operator kind").
Callers read `registry.KINDS` at the time of the call."""

from __future__ import annotations

from backendgen.kinds import aten_kernel, autograd_override, own_op
from backendgen.kinds.kind import OperatorKind, Request

KINDS: tuple[OperatorKind, ...] = (
    aten_kernel.KIND,
    own_op.KIND,
    autograd_override.KIND,
)


def kind_of(name: str, device: str, request: Request) -> OperatorKind:
    """The first kind that claims `name`."""
    return next(k for k in KINDS if k.claims(name, device, request))
