"""The operator kinds (backendgen.kinds): each name goes to one kind, and a new kind is one module plus
one line in the registry that add-op, remove-op and check then loop over (docs/architecture.md)."""

from __future__ import annotations

import inspect
import shutil
from dataclasses import dataclass

import pytest

from backendgen import api
from backendgen.kinds import kind as kindmod
from backendgen.kinds import registry
from backendgen.kinds.kind import Planned, Request
from backendgen.plumbing.errors import ProjectError


@pytest.fixture
def project(rendered_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    return root


def _protocol_methods() -> set[str]:
    return {
        name
        for name, value in vars(kindmod.OperatorKind).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def test_every_registered_kind_implements_the_whole_protocol():
    wanted = _protocol_methods()
    assert {"plan", "write", "removals", "registration", "check", "carry"} <= wanted
    for kind in registry.KINDS:
        missing = sorted(m for m in wanted if not callable(getattr(kind, m, None)))
        assert missing == [], f"{type(kind).__name__} lacks {missing}"
        assert kind.section in {"ops", "custom_ops", "autograd_overrides"}


@pytest.mark.parametrize(
    "name, autograd, kind",
    [
        ("aten::mul.Tensor", False, "kernel"),
        ("mul.Tensor", False, "kernel"),
        ("aten::sin", True, "autograd override"),
        ("mychip::scale", False, "own operator"),
        ("mychip::scale", True, "own operator"),
    ],
)
def test_each_name_goes_to_its_kind(name, autograd, kind):
    assert registry.kind_of(name, "mychip", Request(autograd=autograd)).name == kind


@dataclass
class _Cell:
    name: str


class FusedCells:
    """A fourth kind, as a team would add one: it claims `aten::_fake_cell*` names and writes one file."""

    name = "fused cell"
    section = "custom_ops"
    written: list[str] = []

    def claims(self, name, device, request):
        return name.startswith("aten::_fake_cell")

    def check_request(self, names, project, request):
        pass

    def plan(self, names, project, db, request):
        return Planned(self, items=[_Cell(n) for n in names], notes=[f"{len(names)} fused cell(s)"])

    def qualified(self, item):
        return item.name

    def files(self, item, project):
        return [f"csrc/cells/{item.name.removeprefix('aten::')}.cpp"]

    def tests(self, item, project):
        return []

    def write(self, item, project, db, tx):
        self.written.append(item.name)
        return item.name

    def records(self, project):
        return []

    def record_files(self, rec):
        return []

    def record_tests(self, rec):
        return []

    def removals(self, name, project, request):
        raise ProjectError(f"{name} has no fused cell in this project")

    def unrecord(self, project, rec):
        pass

    def registration(self, project, db):
        return {}

    def expected_keys(self, project):
        return {}

    def carry(self, project, db, step):
        pass

    def check(self, report, project, db, probed):
        pass


def test_a_new_kind_is_one_class_and_one_line_in_the_registry(project, monkeypatch):
    cells = FusedCells()
    assert _protocol_methods() <= {m for m in dir(cells) if not m.startswith("_")}
    monkeypatch.setattr(registry, "KINDS", (cells, *registry.KINDS))
    result = api.add_ops(["aten::_fake_cell_lstm", "aten::abs.out"], project, dry_run=True)
    assert sorted(result.added) == ["aten::_fake_cell_lstm", "aten::abs.out"]
    assert project / "csrc/cells/_fake_cell_lstm.cpp" in result.files
    assert "1 fused cell(s)" in result.notes
    with pytest.raises(ProjectError, match="has no fused cell"):
        api.remove_ops(["aten::_fake_cell_lstm"], project)
