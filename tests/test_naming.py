"""Device names: a table of what is refused, and what every accepted name turns into."""

import pytest

from backendgen.plumbing.errors import InvalidNameError
from backendgen.project import naming


@pytest.mark.parametrize(
    "name, reason",
    [
        ("", "empty"),
        ("MyChip", "upper-case"),
        ("my chip", "not made of lower-case letters"),
        ("my-chip", "not made of lower-case letters"),
        ("npu2", "contains a digit"),
        ("1chip", "digit"),
        ("class", "Python keyword"),
        ("lambda", "Python keyword"),
        ("match", "Python keyword"),
        ("mychip\u0430", "non-ASCII"),  # Cyrillic a: a look-alike
        ("ｍychip", "non-ASCII"),  # full-width m
        ("../chip", "not made of lower-case letters"),
        ("a/b", "not made of lower-case letters"),
        ("x" * 33, "longer than 32"),
        ("{{cookiecutter}}", "not made of lower-case letters"),
        ('chip"', "not made of lower-case letters"),
        ("chip;rm", "not made of lower-case letters"),
        ("$(touch)", "not made of lower-case letters"),
        ("chip__x", "double or trailing underscore"),
        ("chip_", "double or trailing underscore"),
        ("cpu", "built-in torch device type"),
        ("cuda", "built-in torch device type"),
        ("meta", "built-in torch device type"),
        ("xla", "built-in torch device type"),
        ("mps", "built-in torch device type"),
        ("xpu", "built-in torch device type"),
        ("hpu", "built-in torch device type"),
        ("mtia", "built-in torch device type"),
        ("privateuseone", "built-in torch device type"),
        ("namespace", r"C\+\+ keyword"),
        ("torch", "reserved"),
        ("json", "standard-library module"),
        ("numpy", "importable module"),
        ("nn", "collides with torch.nn"),
        ("linalg", "collides with torch.linalg"),
        ("add", "collides with torch.add"),
    ],
)
def test_bad_names_are_refused_with_a_reason(name, reason):
    with pytest.raises(InvalidNameError, match=reason):
        naming.check_device_name(name)


@pytest.mark.parametrize("name", ["mychip", "my_chip", "z"])
def test_good_names_pass(name):
    naming.check_device_name(name)


def test_derived_names():
    n = naming.derive("mychip")
    assert (n.device, n.DEVICE, n.package, n.dist_name) == ("mychip", "MYCHIP", "torch_mychip", "torch-mychip")
    assert naming.derive("mychip", "acme_torch").dist_name == "acme-torch"
