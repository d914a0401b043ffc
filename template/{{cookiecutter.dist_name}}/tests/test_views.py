"""View operators on the {{ cookiecutter.device }} device return views of their input, never copies.

A view shares its input's device memory: writes through it reach the input (and the input's
writes reach it), autograd knows it as a view (`_base`, one version counter) and differentiates
through it. These hold whether the operator has a native view kernel (`backendgen add-op
aten::view_as_real` writes one: metadata only) or runs through the CPU fallback, which maps a CPU
result that aliases an argument back onto the argument's device storage
(csrc/aten/fallback.cpp). A view operator whose CPU kernel returns new memory would silently
become a copy there: the fallback raises an error naming `backendgen add-op` instead, unless
{{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1 accepts the copy.
"""

import pytest
import torch

from tests.conftest import DEVICE, fallback_warnings, fresh_process


def both(cpu: torch.Tensor):
    """The CPU tensor and a device copy of it."""
    return cpu, cpu.to(DEVICE)


def assert_view_of(view: torch.Tensor, base: torch.Tensor, cpu_view: torch.Tensor):
    """`view` is on `base`'s device memory, is its autograd view, and has `cpu_view`'s geometry."""
    assert view.device.type == DEVICE
    on_base = view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert on_base, "a copy, not a view: the result is not on its input's memory"
    assert view._base is (base if base._base is None else base._base)
    assert (view.dtype, view.shape, view.stride(), view.storage_offset()) == (
        cpu_view.dtype, cpu_view.shape, cpu_view.stride(), cpu_view.storage_offset())
    torch.testing.assert_close(view.cpu(), cpu_view, rtol=0, atol=0)


def test_view_as_real_is_a_view_at_the_right_offset():
    full, dfull = both(torch.randn(5, 3, dtype=torch.complex64))
    x, d = full[1:], dfull[1:]  # storage offset 3 complex elements = 6 floats
    cpu_view, view = torch.view_as_real(x), torch.view_as_real(d)
    assert view.storage_offset() == 6 and view.dtype == torch.float32
    assert_view_of(view, d, cpu_view)
    version = d._version
    view[0, 1, 1] = 42.0  # the imaginary part of d[0, 1]
    cpu_view[0, 1, 1] = 42.0
    assert d._version > version  # the view and its base share one version counter
    torch.testing.assert_close(dfull.cpu(), full, rtol=0, atol=0)
    d[2, 0] = 7 + 8j  # and the base's writes reach the view
    assert view[2, 0].tolist() == [7.0, 8.0]


def test_view_as_complex_is_a_view_at_the_right_offset():
    full, dfull = both(torch.randn(9, 2))
    x, d = full[3:], dfull[3:]  # storage offset 6 floats = 3 complex elements
    cpu_view, view = torch.view_as_complex(x), torch.view_as_complex(d)
    assert view.storage_offset() == 3 and view.dtype == torch.complex64
    assert_view_of(view, d, cpu_view)
    view[1] = 5 - 6j
    cpu_view[1] = 5 - 6j
    torch.testing.assert_close(dfull.cpu(), full, rtol=0, atol=0)
    assert dfull[4].tolist() == [5.0, -6.0]


def test_unfold_is_a_view_of_overlapping_windows():
    x, d = both(torch.arange(10.0))
    cpu_view, view = x.unfold(0, 4, 2), d.unfold(0, 4, 2)
    assert_view_of(view, d, cpu_view)
    view[1, 0] = 100.0  # element 2 of the input, seen by windows 0 and 1
    assert d[2].item() == 100.0 and view[0, 2].item() == 100.0


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda t: torch.view_as_real(t).unfold(0, 2, 1), id="view_as_real+unfold"),
        pytest.param(lambda t: torch.view_as_complex(torch.view_as_real(t)), id="view_as_complex(view_as_real)"),
    ],
)
def test_gradients_flow_through_views(make_view):
    x = torch.randn(6, dtype=torch.complex64)
    grads = []
    for device in ("cpu", DEVICE):
        leaf = x.to(device, copy=True).requires_grad_()
        out = make_view(leaf)
        assert out._base is leaf
        loss = (out * out.conj()).real.sum() if out.is_complex() else (out * out).sum()
        loss.backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1].cpu(), grads[0])


def test_in_place_through_a_view_is_seen_by_autograd():
    # the view and its base share a version counter: modifying the base after saving the view for
    # backward is an error on the device as on the CPU
    for device in ("cpu", DEVICE):
        leaf = torch.randn(4, dtype=torch.complex64, device=device, requires_grad=True)
        base = leaf * 1
        view = torch.view_as_real(base)
        y = view.pow(2).sum()
        view.mul_(2)  # in place through the view: pow saved it, so backward must refuse
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


_FALLBACK_VIEW = """
import torch, {{ cookiecutter.package }}
lib = torch.library.Library("viewwarn", "DEF")
lib.define("flat(Tensor(a) x) -> Tensor(a)")
lib.impl("flat", lambda x: x.view(-1), "CPU")  # a true view on the CPU
torch.ops.viewwarn.flat(torch.zeros(4, 2, device="{{ cookiecutter.device }}"))
"""
FALLBACK_VIEW_WARNED = fresh_process(_FALLBACK_VIEW, set_env={"{{ cookiecutter.DEVICE }}_WARN_FALLBACK": "1"})


def test_the_fallback_warning_says_a_view_through_the_fallback_copies():
    # every ATen view operator that would reach the fallback has a native kernel (the test below),
    # so a view operator of another library stands in
    out = FALLBACK_VIEW_WARNED.result()
    assert out.returncode == 0, out.stderr
    assert "viewwarn::flat has no {{ cookiecutter.device }} kernel and runs on the CPU: a view operator" in out.stderr, out.stderr
    assert "PrivateUse1 kernel for viewwarn::flat with torch.library" in out.stderr, out.stderr


def no_view_kernel(name: str) -> str | None:
    """Why an ATen view operator still reaches the CPU fallback in a fresh project (None: it must
    not): backendgen writes view kernels for strided results only (kernelgen.view_base), so
    `_nested_view_from_buffer` and any other nested-tensor view keep the fallback."""
    return "its result is a nested tensor" if "nested" in name else None


_DEFAULT_KERNELS = ("PrivateUse1", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                    "CompositeImplicitAutograd")


def _returns_a_view(schema) -> bool:
    """A result that aliases an input without writing it (`Tensor(a)`, not `Tensor(a!)`)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def view_ops_on_the_fallback() -> tuple[list[str], int]:
    """The ATen view operators of the installed torch that the live dispatcher sends to this device's
    CPU fallback (a CPU kernel, and neither a {{ cookiecutter.device }} kernel nor a composite one,
    which the dispatcher would run first), and how many view operators with a CPU kernel it has."""
    on_fallback, with_cpu = [], 0
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, overload = name.partition(".")
        if not _returns_a_view(torch._C._get_schema(base, overload)):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            continue  # sparse-, nested- or CUDA-only: the fallback has nothing to run
        with_cpu += 1
        if not any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in _DEFAULT_KERNELS):
            on_fallback.append(name)
    return sorted(on_fallback), with_cpu


def test_no_view_operator_of_this_torch_reaches_the_cpu_fallback():
    """`backendgen new` gives every such view operator a native view kernel (derived from torch's
    operator database when the project was generated): a torch with a new one fails here, naming it
    (`backendgen add-op` it)."""
    on_fallback, with_cpu = view_ops_on_the_fallback()
    assert with_cpu >= 4  # view, as_strided, view_as_real, ... : the query sees the view operators
    missing = [name for name in on_fallback if no_view_kernel(name) is None]
    assert missing == [], f"view operators without a {DEVICE} kernel (they copy through the CPU fallback): {missing}"


def test_view_operators_run_without_the_fallback(mod):
    z, dz = both(torch.randn(4, dtype=torch.complex64))
    x, dx = both(torch.arange(12.0).view(3, 4))
    mod.reset_fallback_counts()
    r, w = torch.view_as_real(dz), dx.unfold(1, 2, 1)
    c = torch.view_as_complex(r)
    assert mod.fallback_counts() == {}
    assert_view_of(r, dz, torch.view_as_real(z))
    assert_view_of(c, r, torch.view_as_complex(torch.view_as_real(z)))
    assert_view_of(w, dx, x.unfold(1, 2, 1))


_COPYING_VIEW = """
import torch, {{ cookiecutter.package }}
lib = torch.library.Library("viewcheck", "DEF")
lib.define("copying_view(Tensor(a) x) -> Tensor(a)")  # says: a view of x
lib.impl("copying_view", lambda x: x.clone(), "CPU")  # but returns new memory
d = torch.zeros(3, device="{{ cookiecutter.device }}")
try:
    v = torch.ops.viewcheck.copying_view(d)
except RuntimeError as e:
    print("ERROR", str(e).splitlines()[0])
else:
    v.fill_(1.0)
    print("COPY", v.device.type, d.sum().item())
"""
COPYING_VIEW_REFUSED = fresh_process(_COPYING_VIEW)
# the switch is read at the first such call (csrc/aten/fallback.cpp), so it may be set after import
COPYING_VIEW_ACCEPTED = fresh_process(_COPYING_VIEW, set_env={"{{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES": "1"})


def test_the_fallback_refuses_to_turn_a_view_into_a_copy():
    out = COPYING_VIEW_REFUSED.result()
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ERROR"), line
    assert "viewcheck::copying_view returns a view of its input" in line
    # add-op makes kernels for aten:: and {{ cookiecutter.device }}:: operators; another library's goes through torch.library
    assert "PrivateUse1 kernel for viewcheck::copying_view with torch.library" in line
    assert "backendgen add-op viewcheck" not in line and "{{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1" in line


def test_the_documented_switch_accepts_a_copy():
    out = COPYING_VIEW_ACCEPTED.result()
    assert out.returncode == 0, out.stderr
    # a copy on the device: writes through it do not reach the input
    assert out.stdout.strip().splitlines()[-1] == "COPY {{ cookiecutter.device }} 0.0"
