"""Device names: what is accepted, and every other name derived from the one a user types.

A device name becomes a torch device type (`torch.device("mychip")`), an attribute of the torch
module (`torch.mychip`), a C++ namespace, part of a Python package name and of environment
variables. It is checked against all of those before anything is written, so no value a user
types reaches a generated file unless it is made of lower-case ASCII letters and _.
"""

from __future__ import annotations

import importlib.util
import json
import keyword
import re
import subprocess
import sys
from dataclasses import dataclass

from backendgen.plumbing import interrupt
from backendgen.plumbing.environment import subprocess_env
from backendgen.plumbing.errors import InvalidNameError
from backendgen.plumbing.files import write_atomic

MAX_LENGTH = 32
_VALID = re.compile(r"^[a-z][a-z_]*$")  # torch.device() accepts no digits in a device type

# c10::DeviceType names (c10/core/DeviceType.h) and the spellings torch.device accepts.
BUILTIN_DEVICE_TYPES = frozenset(
    """cpu cuda mkldnn opengl opencl ideep hip fpga maia xla vulkan metal xpu mps meta hpu ve lazy
    ipu mtia privateuseone""".split()
)
# Names that would shadow the libraries the generated code is written in.
RESERVED = frozenset("torch aten c10 at std caffe2 torchgen pybind11 python backendgen test tests".split())
CPP_KEYWORDS = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export extern
    false float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr
    operator or or_eq private protected public register reinterpret_cast requires return short signed
    sizeof static static_assert static_cast struct switch template this thread_local throw true try
    typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    final override import module""".split()
)


@dataclass(frozen=True)
class Names:
    device: str  # mychip
    DEVICE: str  # MYCHIP
    package: str  # torch_mychip
    dist_name: str  # torch-mychip

    def context(self) -> dict[str, str]:
        return {"device": self.device, "DEVICE": self.DEVICE, "package": self.package, "dist_name": self.dist_name}


def derive(device: str, package: str | None = None) -> Names:
    pkg = package or f"torch_{device}"
    return Names(device=device, DEVICE=device.upper(), package=pkg, dist_name=pkg.replace("_", "-"))


def _shown(name: str) -> str:
    return repr(name if len(name) <= 40 else name[:40] + "…")


def check_syntax(name: str, what: str = "device name") -> None:
    """Refuse anything but a short name of lower-case ASCII letters and _ (no torch needed)."""
    if not isinstance(name, str) or name == "":
        raise InvalidNameError(f"the {what} is empty")
    if len(name) > MAX_LENGTH:
        raise InvalidNameError(f"the {what} {_shown(name)} is longer than {MAX_LENGTH} characters")
    if not name.isascii():
        raise InvalidNameError(
            f"the {what} {_shown(name)} contains non-ASCII characters; use lower-case ASCII letters, digits and _"
        )
    if not _VALID.match(name):
        if name[0].isdigit():
            why = "starts with a digit"
        elif name.lower() != name and _VALID.match(name.lower()):
            why = "has upper-case letters"
        else:
            why = "is not made of lower-case letters and _"
        if any(ch.isdigit() for ch in name) and what == "device name":
            why = "contains a digit, which torch.device() does not accept in a device type"
        raise InvalidNameError(f"the {what} {_shown(name)} {why}; use lower-case letters and _ (e.g. mychip)")
    if "__" in name or name.endswith("_"):
        raise InvalidNameError(f"the {what} {_shown(name)} has a double or trailing underscore; C++ reserves those")


def check_device_name(name: str) -> None:
    """Refuse names that are invalid or collide with something torch, Python or C++ already owns."""
    check_syntax(name)
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise InvalidNameError(f"the device name {name!r} is a Python keyword")
    if name in CPP_KEYWORDS:
        raise InvalidNameError(f"the device name {name!r} is a C++ keyword")
    if name in BUILTIN_DEVICE_TYPES:
        raise InvalidNameError(f"the device name {name!r} is a built-in torch device type; choose another name")
    if name in RESERVED:
        raise InvalidNameError(f"the device name {name!r} is reserved; choose another name")
    if name in sys.builtin_module_names or name in sys.stdlib_module_names:
        raise InvalidNameError(f"the device name {name!r} is a Python standard-library module; choose another name")
    if importlib.util.find_spec(name) is not None:
        raise InvalidNameError(
            f"the device name {name!r} is an importable module in this environment; choose another name"
        )
    if name in torch_attribute_names():
        raise InvalidNameError(f"the device name {name!r} collides with torch.{name}; choose another name")


def check_package_name(package: str) -> None:
    check_syntax(package, "package name")
    if keyword.iskeyword(package) or package in RESERVED or package in sys.stdlib_module_names:
        raise InvalidNameError(f"the package name {package!r} is reserved; choose another name")


def torch_attribute_names() -> frozenset[str]:
    """Names that `torch.<name>` already has (cached per torch version; torch is imported once, in a subprocess)."""
    from backendgen.torchdb.opdb import cache_dir, torch_info

    info = torch_info()
    path = cache_dir() / f"torch-attrs-{info.version}.json"
    try:
        return frozenset(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    out = interrupt.run(
        [sys.executable, "-m", "backendgen.programs.torch_names"],
        capture_output=True,
        text=True,
        env=subprocess_env(autoload="0"),
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        from backendgen.plumbing.errors import EnvironmentProblem

        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EnvironmentProblem(f"cannot import torch: {last}")
    names = json.loads(out.stdout)
    try:
        write_atomic(path, json.dumps(names))
    except OSError:
        pass  # an unwritable cache only costs time
    return frozenset(names)
