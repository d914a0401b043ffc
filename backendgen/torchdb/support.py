"""Which torch versions backendgen supports: the policy. The versions themselves are written once,
in the template's manifest (`torch.tested`, `torch.minimum` in template/template.json).

- TESTED: the releases this repo's test suite proves end to end (tests/test_torch_matrix.py:
  generate, build, run the generated suite, add operators, check), each in a fresh virtualenv.
- MINIMUM: the oldest torch whose extension points the template uses (the PrivateUse1 hooks with
  `resizePrivateUse1Bytes`, `c10::DeviceAllocator`, `REGISTER_HOST_ALLOCATOR`, the
  `torch.backends` autoload group, ...). An older torch is refused with one line.
- Anything newer than the minimum that is not in TESTED (a newer release, a patch release or a
  nightly between two tested ones) is not refused: commands proceed and carry a note naming the
  tested versions, and `backendgen check` reports what differs from the torch the project was made for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backendgen.plumbing.errors import EnvironmentProblem
from backendgen.project import manifest


def tested() -> tuple[str, ...]:
    return manifest.load().torch_tested


def minimum() -> str:
    return manifest.load().torch_minimum


def __getattr__(name: str):
    # support.TESTED and support.MINIMUM, read from the manifest when first asked for (not at
    # import: a missing template is then the CLI's one-line error, not an import failure)
    if name == "TESTED":
        return tested()
    if name == "MINIMUM":
        return minimum()
    raise AttributeError(name)


_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a torch version string ('2.14.1+cu130', '2.16.0.dev20260101'), or None."""
    m = _RELEASE.match(version.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class Support:
    version: str  # as installed, e.g. "2.14.1+cu130"
    tested: bool

    @property
    def note(self) -> str | None:
        """One line for an untested torch; None for a tested one."""
        if self.tested:
            return None
        return (
            f"torch {self.version} has not been tested with this backendgen (tested: {', '.join(tested())}); "
            "proceeding — `backendgen check` reports what differs"
        )


def torch_support(version: str) -> Support:
    """The policy applied to an installed torch version: refuse one older than MINIMUM (or one
    whose version cannot be read), else say whether it is one of the TESTED releases."""
    rel = release(version)
    if rel is None:
        raise EnvironmentProblem(
            f"cannot read torch's version {version!r}; reinstall torch (pip install torch=={tested()[-1]})"
        )
    if rel < release(minimum()):
        raise EnvironmentProblem(
            f"torch {version} is older than {minimum()}, the oldest torch whose extension points the template uses; "
            f"pip install torch=={tested()[-1]} (tested: {', '.join(tested())})"
        )
    # a local build tag (+cpu, +cu130) does not change what is tested; a pre-release does
    public = version.split("+", 1)[0]
    return Support(version, tested=public in tested())
