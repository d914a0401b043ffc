"""Call the backend's own custom operators (its TORCH_LIBRARY namespace) from Python.

    python examples/custom_op.py [--device NAME]

A generated backend defines operators in a namespace named after its package, in C++
(`TORCH_LIBRARY(<package>, m)` in csrc/aten/serialization.cpp): `set_layout_tag(Tensor self, bool
tagged) -> ()` and `layout_tag(Tensor self) -> bool`, which set and read a flag the backend keeps
on a tensor's implementation (c10::BackendMeta) and writes into checkpoints. This example lists
the namespace's operators with their schemas, calls them through `torch.ops.<package>`, shows
they answer for CPU tensors too, and that the flag survives torch.save/torch.load. It is the
pattern for giving Python any C++ function that takes tensors: define it with `m.def(schema, fn)`
and call `torch.ops.<package>.<name>`, without binding code. Exits 1 if a call misbehaves.
"""

from __future__ import annotations

import io

import torch
from _common import backend_device, fail, parser


def main() -> None:
    opts = parser(__doc__.splitlines()[0]).parse_args()
    device = backend_device(opts.device)
    package = getattr(torch, device).__name__.split(".")[0]  # torch.NAME is <package>.device_module
    ns = getattr(torch.ops, package)

    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(f"{package}::"))
    if not names:
        fail(f"the {package} namespace has no operators")
    print(f"operators in the {package} namespace:")
    for name in names:
        op = getattr(ns, name.split("::", 1)[1]).default
        print(f"  {op._schema}")

    x = torch.randn(4, device=device)
    print(f"torch.ops.{package}.layout_tag(x) on a fresh {device} tensor: {ns.layout_tag(x)}")
    ns.set_layout_tag(x, True)
    tagged = ns.layout_tag(x)
    print(f"after torch.ops.{package}.set_layout_tag(x, True): {tagged}")
    if tagged is not True:
        fail("set_layout_tag did not set the tag")

    cpu = torch.randn(4)
    print(f"on a CPU tensor: layout_tag -> {ns.layout_tag(cpu)} (the operator answers for every device)")

    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    print(f"after torch.save/torch.load: layout_tag -> {ns.layout_tag(loaded)}, on {loaded.device}")
    if not ns.layout_tag(loaded) or ns.layout_tag(cpu):
        fail("the tag did not travel as expected")

    ns.set_layout_tag(x, False)
    if ns.layout_tag(x):
        fail("set_layout_tag(x, False) did not clear the tag")
    try:
        ns.layout_tag(x, True)
    except (RuntimeError, TypeError) as e:  # the schema is checked when the operator is called
        print(f"a call that does not match the schema is refused: {str(e).splitlines()[0]}")
    else:
        fail("a call with an extra argument was accepted")
    print("ok: the backend's custom operators work from Python")


if __name__ == "__main__":
    main()
