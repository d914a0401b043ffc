"""`backendgen new NAME --driver minimal`: a project whose driver is the minimal one (the port API of
driver.h alone) in place of the emulator, recorded in backendgen.json and kept by `update`; the rule
that nothing outside csrc/driver includes more of the driver than driver.h (the contract audit of
the template as each driver lays it out, of a generated project, and `backendgen check`'s warning).
Fast: nothing is built."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, unique_device

from backendgen import api
from backendgen.commands import check, update
from backendgen.kinds.findings import Area, CheckReport, Kind, Severity
from backendgen.plumbing.errors import ProjectError
from backendgen.project import contract, drivers, history, manifest, template_states, template_tree
from backendgen.project.on_disk import METADATA_FILE, Project

CURRENT = history.current_version()
EMULATOR_FILES = ("csrc/driver/streams.cpp", "csrc/driver/emulator.h")


@pytest.fixture(scope="module")
def minimal_project(tmp_path_factory) -> Path:
    """A project made with --driver minimal, not built. Copy before modifying."""
    root = tmp_path_factory.mktemp("minimal") / "project"
    res = api.new_backend(unique_device("min"), root, driver="minimal", build_it=False)
    assert res.driver == "minimal"
    return root


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def _run_module(module: str, *args: str):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".backendgen.lock"
    }


# --- new --driver ------------------------------------------------------------------------------------


def test_an_unknown_driver_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = run_cli("new", unique_device(), "-o", str(tmp_path / "p"), "--no-build", "--driver", "emulater")
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: unknown driver 'emulater': --driver is one of emulator, minimal"], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "p").exists()


def test_new_with_the_minimal_driver_says_so_and_records_it(tmp_path):
    root = tmp_path / "p"
    out = run_cli("new", unique_device("cli"), "-o", str(root), "--no-build", "--driver", "minimal")
    assert out.returncode == 0, out.stderr
    assert "backend with the minimal driver rendered (not built)" in out.stdout
    assert json.loads((root / METADATA_FILE).read_text())["driver"] == "minimal"


def test_the_minimal_driver_takes_the_emulators_place(minimal_project):
    project = Project.load(minimal_project)
    assert project.driver == "minimal" and project.record.driver == "minimal"
    assert sorted(p.name for p in (minimal_project / "csrc" / "driver").iterdir()) == ["driver.cpp", "driver.h"]
    for rel in EMULATOR_FILES:
        assert not (minimal_project / rel).exists(), rel
    driver = (minimal_project / "csrc" / "driver" / "driver.cpp").read_text()
    # the template's minimal driver, rendered with the project's names like every other file
    assert "{{" not in driver and "{%" not in driver
    assert f"namespace {project.device}::driver" in driver and '#include "driver/driver.h"' in driver
    tpl = manifest.template_dir()
    assert driver != (tpl / drivers.PROJECT_DIR / "csrc" / "driver" / "driver.cpp").read_text()
    # every other file is the template's, as for the emulator
    assert (minimal_project / "csrc" / "driver" / "driver.h").is_file() and (minimal_project / "setup.py").is_file()


def test_no_file_of_a_minimal_project_names_the_emulator(minimal_project):
    hits = []
    for path in sorted(minimal_project.rglob("*")):
        if path.is_file():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if re.search("emulat", line, re.I):
                    hits.append(f"{path.relative_to(minimal_project)}:{n}: {line.strip()[:100]}")
    assert hits == []


def test_an_emulator_project_is_unchanged_and_records_its_driver(rendered_project):
    assert json.loads((rendered_project / METADATA_FILE).read_text())["driver"] == "emulator"
    for rel in EMULATOR_FILES:
        assert (rendered_project / rel).is_file(), rel
    assert Project.load(rendered_project).driver == "emulator"


def test_a_record_without_a_driver_is_an_emulator_project_and_is_written_back_as_it_was(rendered_project, tmp_path):
    """backendgen.json before --driver: no `driver` key, which means the emulator; writing the record
    back adds none and keeps the keys' order."""
    (tmp_path / "p").mkdir()
    data = json.loads((rendered_project / METADATA_FILE).read_text())
    del data["driver"]
    data = {"zz_newer": 1, **data}  # a key a newer backendgen wrote
    (tmp_path / "p" / METADATA_FILE).write_text(json.dumps(data))
    project = Project.load(tmp_path / "p")
    assert project.record.driver is None and project.driver == "emulator"
    assert list(project.record.to_json()) == list(data)
    data["driver"] = "Minimal Driver"
    (tmp_path / "p" / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(ProjectError, match=r"driver is malformed: 'Minimal Driver' is not a driver name"):
        Project.load(tmp_path / "p")


# --- the driver's includes ---------------------------------------------------------------------------


def test_the_contract_names_a_file_outside_the_driver_that_includes_more_than_driver_h(minimal_project, tmp_path):
    root = _copy(minimal_project, tmp_path / "p")
    assert contract.audit_project(root) == []
    extra = root / "csrc" / "aten" / "extra.cpp"
    extra.write_text(
        '#include "driver/driver.h"\n#include <driver/driver.h>\n'
        '#include "driver/emulator.h"\n#include "../driver/driver.cpp"\n'
        '// #include "driver/streams.cpp" (a comment)\n'
    )
    (root / "build").mkdir()
    (root / "build" / "unity.cpp").write_text('#include "../csrc/driver/driver.cpp"\n')  # a build's, not a source
    assert contract.audit_project(root) == [
        'csrc/aten/extra.cpp: includes "driver/emulator.h" (csrc/driver/emulator.h): outside csrc/driver/ nothing '
        "includes more of the driver than driver/driver.h, the port API",
        'csrc/aten/extra.cpp: includes "../driver/driver.cpp" (csrc/driver/driver.cpp): outside csrc/driver/ '
        "nothing includes more of the driver than driver/driver.h, the port API",
    ]
    out = _run_module("backendgen.project.contract", str(root))
    assert out.returncode == 1 and out.stdout.count("csrc/aten/extra.cpp: includes") == 2, out.stdout + out.stderr


def test_check_warns_of_a_file_that_includes_more_of_the_driver(rendered_project, tmp_path):
    root = _copy(rendered_project, tmp_path / "p")
    report = CheckReport(project=str(root), strict=False)
    check._check_driver_includes(report, Project.load(root))
    assert report.findings == []
    (root / "csrc" / "python" / "extra.cpp").write_text('#include "driver/emulator.h"\n')
    check._check_driver_includes(report, Project.load(root))
    [finding] = report.findings
    assert (finding.area, finding.severity, finding.subject) == (Area.API, Severity.WARNING, "csrc/python/extra.cpp")
    assert finding.detail == {"kind": Kind.DRIVER_INCLUDE, "include": "csrc/driver/emulator.h"}
    assert "driver/driver.h, the port API" in finding.message


@pytest.fixture
def template_copy(tmp_path) -> Path:
    dest = tmp_path / "template"
    shutil.copytree(manifest.template_dir(), dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_the_template_is_audited_as_each_driver_lays_it_out(template_copy):
    assert contract.audit(template_copy) == []
    minimal = template_copy / "drivers" / "minimal" / "driver.cpp"
    minimal.write_text(minimal.read_text().replace('#include "driver/driver.h"\n', '#include "driver/emulator.h"\n', 1))
    kernel = template_copy / drivers.PROJECT_DIR / "csrc" / "aten" / "batch_norm.cpp"
    kernel.write_text('#include "driver/streams.cpp"\n' + kernel.read_text())
    assert contract.audit(template_copy) == [
        'csrc/aten/batch_norm.cpp: includes "driver/streams.cpp" (csrc/driver/streams.cpp): outside csrc/driver/ '
        "nothing includes more of the driver than driver/driver.h, the port API",
        'with --driver minimal: csrc/aten/batch_norm.cpp: includes "driver/streams.cpp" (csrc/driver/streams.cpp), '
        "which the project lacks",
        'with --driver minimal: csrc/driver/driver.cpp: includes "driver/emulator.h" (csrc/driver/emulator.h), '
        "which the project lacks",
    ]
    minimal.unlink()
    assert contract.audit(template_copy) == [
        "drivers: minimal: drivers/minimal/driver.cpp (its csrc/driver/driver.cpp) is in template.json but not in "
        "the template"
    ]


# --- update -------------------------------------------------------------------------------------------


def test_update_of_a_current_minimal_project_does_nothing(minimal_project, tmp_path):
    root = _copy(minimal_project, tmp_path / "p")
    before = _tree(root)
    result = api.update_project(root, build_it=False)
    assert result.exit_code == 0 and result.changes == [], result.changes
    assert _tree(root) == before


def _predating_state() -> history.State:
    """The latest stored state from before --driver minimal."""
    return next(s for s in reversed(history.states()) if not drivers.supports(history.manifest_of(s), "minimal"))


def test_update_refuses_a_minimal_project_whose_recorded_base_predates_the_driver(minimal_project, tmp_path):
    root = _copy(minimal_project, tmp_path / "p")
    state = _predating_state()
    meta = json.loads((root / METADATA_FILE).read_text())
    meta.update(template_state=state.hash, template_version=str(state.version))
    (root / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    before = _tree(root)
    out = run_cli("update", "--no-build", "--project", str(root))
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "records the minimal driver" in errors[0], out.stderr
    assert f"which the recorded {state.describe()} predates" in errors[0], errors[0]
    assert "Traceback" not in out.stderr and _tree(root) == before


def test_a_minimal_projects_merge_base_is_never_a_state_without_the_driver(minimal_project, tmp_path):
    """Without a recorded state, the base is the best-matching state of the project's version that
    has the driver; when none has it, update refuses (before rendering anything)."""
    root = _copy(minimal_project, tmp_path / "p")
    version = CURRENT - 1  # (a project of the current version without a recorded state: the installed template)
    meta = json.loads((root / METADATA_FILE).read_text())
    del meta["template_state"]
    meta["template_version"] = str(version)
    (root / METADATA_FILE).write_text(json.dumps(meta))
    if any(drivers.supports(history.manifest_of(s), "minimal") for s in history.states(version)):
        pytest.skip(f"template {version} has stored states with the minimal driver")
    with pytest.raises(ProjectError, match=f"which every stored state of template {version} predates"):
        template_states.choose_base(Project.load(root), version)


TEAM_DRIVER_LINE = "// TEAM: the rev B board's driver\n"
TEAM_README_LINE = "Team notes: the rev B board.\n"
DROPPED_README_LINE = b"A line the next template drops.\n"


def test_update_of_a_minimal_project_merges_its_own_driver_and_never_brings_the_emulator_back(
    minimal_project, tmp_path, monkeypatch
):
    """A minimal project made from an earlier template state (one with the minimal driver: stored,
    as `history --snapshot` stores them) is merged with the minimal driver on both sides: the
    template's change to the minimal driver reaches the project's edited driver.cpp, and the
    emulator's files never come back."""
    tpl = manifest.template_dir()
    files = template_tree.files(tpl)
    source = manifest.load().drivers["minimal"].files["csrc/driver/driver.cpp"]
    files[source] = files[source].split(b"\n", 1)[1]  # the newer template adds the minimal driver's first line
    first = (minimal_project / "csrc" / "driver" / "driver.cpp").read_bytes().split(b"\n", 1)[0]  # rendered
    readme = f"{drivers.PROJECT_DIR}/README.md"
    files[readme] = DROPPED_README_LINE + files[readme]  # ... and drops this line of the README
    digests = {rel: template_tree.blob_hash(data) for rel, data in files.items()}
    states, blobs = history._store()
    earlier = history.State(
        hash=template_tree.state_hash_of(digests),
        version=CURRENT,
        commit="e" * 40,
        tree="0" * 40,
        order=len(states),
        files=tuple(sorted(digests.items())),
    )
    stored = {**blobs, **{digests[rel]: data for rel, data in files.items()}}
    monkeypatch.setattr(history, "_store", lambda: ((*states, earlier), stored))

    root = _copy(minimal_project, tmp_path / "p")
    project = Project.load(root)
    context = template_states.answers(project, CURRENT, project.record.backendgen_version)
    old_files = template_states.rendered_files(earlier, context)
    assert not set(old_files) & set(EMULATOR_FILES) and "csrc/driver/driver.cpp" in old_files
    for rel, data in old_files.items():  # the project as that state generated it
        if rel not in template_states.tool_owned():
            (root / rel).write_bytes(data)
    driver = root / "csrc" / "driver" / "driver.cpp"
    assert not driver.read_bytes().startswith(first)
    driver.write_text(driver.read_text() + TEAM_DRIVER_LINE)  # the team's edits
    (root / "README.md").write_text((root / "README.md").read_text() + TEAM_README_LINE)
    meta = json.loads((root / METADATA_FILE).read_text())
    (root / METADATA_FILE).write_text(json.dumps({**meta, "template_state": earlier.hash}, indent=2) + "\n")

    result = api.update_project(root, build_it=False)
    assert result.exit_code == 0 and result.conflicts == [], result.changes
    assert f"merge base: recorded: {earlier.describe()}" in result.notes
    changed = {c.path: c.action for c in result.changes}
    assert changed["csrc/driver/driver.cpp"] is update.Action.MERGED and changed["README.md"] is update.Action.MERGED
    assert driver.read_bytes().startswith(first + b"\n") and driver.read_text().endswith(TEAM_DRIVER_LINE)
    text = (root / "README.md").read_text()
    assert DROPPED_README_LINE.decode() not in text and text.endswith(TEAM_README_LINE)
    for rel in EMULATOR_FILES:
        assert not (root / rel).exists(), rel
    after = Project.load(root)
    assert after.driver == "minimal" and after.record.template_state == history.current_state()
