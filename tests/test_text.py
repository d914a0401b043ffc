"""Text from outside is text: arguments, paths, compiler and loader messages reach the terminal
verbatim, never read as rich markup, and their terminal control sequences do not act (issue 15)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import run_cli, unique_device

from backendgen.cli.output import visible

# text rich (or jinja, for a path cookiecutter renders) would read as markup
MARKUP_LIKE = ["[/bold]", "[red]x[/]", "[link=https://example.com]x[/link]", "a[b]c", "{{ cookiecutter.device }}"]
CONTROLS = ["\x1b[2J", "\x1b]0;title\x07", "x\ry"]
OUTSIDE = MARKUP_LIKE + CONTROLS


def _clean(out: subprocess.CompletedProcess) -> str:
    """Both streams, after asserting that none of backendgen's failure modes for text shows."""
    both = out.stdout + out.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    for raw in ("\x1b", "\x07", "\r"):
        assert raw not in both, f"a raw {raw!r} reached the terminal: {both!r}"
    return both


def test_visible_shows_control_characters_and_keeps_the_rest():
    assert visible("a[/bold]\tb\nc") == "a[/bold]\tb\nc"
    assert visible("\x1b[2J\x1b]0;t\x07x\ry\x00\x7f\x9b") == "\\x1b[2J\\x1b]0;t\\x07x\\x0dy\\x00\\x7f\\x9b"


@pytest.mark.parametrize("text", OUTSIDE)
def test_device_name(tmp_path, text):
    name = f"chip{text}"
    out = run_cli("new", name, "--no-build", cwd=tmp_path)
    assert out.returncode == 2
    assert repr(name) in _clean(out)  # the error quotes the name as Python writes it
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", OUTSIDE)
def test_package_name(tmp_path, text):
    package = f"pkg{text}"
    out = run_cli("new", unique_device(), "--package", package, "--no-build", cwd=tmp_path)
    assert out.returncode == 2
    assert repr(package) in _clean(out)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", OUTSIDE)
def test_output_directory(tmp_path, text):
    dest = tmp_path / f"in{text}" / "proj"
    dest.parent.mkdir(parents=True)
    out = run_cli("new", unique_device(), "--output", str(dest), "--no-build")
    assert out.returncode == 0, out.stderr
    shown = _clean(out)
    assert f"rendered (not built) in {visible(dest)}\n" in shown and f"cd {visible(dest)}\n" in shown
    assert (dest / "backendgen.json").is_file()


@pytest.mark.parametrize("text", OUTSIDE)
def test_operator_name(rendered_project, tmp_path, text):
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    out = run_cli("add-op", f"aten::{text}", "--no-build", cwd=root)
    assert out.returncode == 2
    assert repr(f"aten::{text}") in _clean(out)


@pytest.mark.parametrize("command", ["add-op abs.out", "build", "ops", "check"])
@pytest.mark.parametrize("text", OUTSIDE)
def test_project_path(tmp_path, command, text):
    missing = tmp_path / f"no{text}"
    out = run_cli(*command.split(), "--project", str(missing))
    assert out.returncode == 2
    assert f"{visible(missing)} is not a directory" in _clean(out)


@pytest.mark.parametrize("text", OUTSIDE)
def test_ops_pattern(text):
    out = run_cli("ops", text)
    assert out.returncode == 0
    assert "operators" in _clean(out)


def test_loader_message_in_a_check_finding(built_project, tmp_path):
    """The issue's crash: a stale build's loader message, `[/…/_C….so: undefined symbol: …]`, in a
    project whose path has markup-like text and an escape sequence, printed by `backendgen check`."""
    root = tmp_path / "in[/x][red]\x1b[2J" / "copy"
    shutil.copytree(built_project, root, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    [so] = (root / json.loads((root / "backendgen.json").read_text())["package"]).glob("_C*.so")
    src = tmp_path / "stale.c"
    src.write_text(
        "extern void at_symbol_from_another_torch(void);\nvoid PyInit__C(void) { at_symbol_from_another_torch(); }\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    out = run_cli("check", "--project", str(root))
    assert out.returncode == 1, out.stdout + out.stderr
    shown = _clean(out)
    assert f"[{visible(so)}: undefined symbol: at_symbol_from_another_torch]" in shown
    assert "built against another torch" in shown


def test_compiler_message_in_a_build_error(rendered_project, tmp_path):
    """A real compile error whose text has markup-like tags, in gcc's colours (escape sequences):
    add-op's one error line quotes the compiler's first error, its escapes shown, not acted on
    (CLICOLOR_FORCE: ninja passes the colours on even to a file)."""
    root = tmp_path / "p"
    shutil.copytree(rendered_project, root)
    first = sorted((root / "csrc" / "aten").glob("*.cpp"))[0]  # the first file of the unit ninja compiles first
    message = "[/bold] [red]x[/] [link=file:x]y[/link]"  # (// would start a comment)
    first.write_text(f'#error {message}\n#include "stop_here.h"\n' + first.read_text())
    # no precompiled headers: ninja's first job is then that unit (CFLAGS here is not the builds' own,
    # so ccache would not have the .gch: 25 s of headers before the error)
    device = json.loads((root / "backendgen.json").read_text())["DEVICE"]
    env = {"MAX_JOBS": "1", "CFLAGS": "-fdiagnostics-color=always", "CLICOLOR_FORCE": "1"}
    out = run_cli(
        "add-op", "abs.out", "--no-test", "--project", str(root), env={**env, f"{device}_PRECOMPILED_HEADERS": "0"}
    )
    assert out.returncode == 1, out.stdout + out.stderr
    shown = _clean(out)
    assert "build failed" in shown and f"#error {message}" in shown
    assert "\\x1b[" in shown.split("build failed")[1]  # gcc's colour codes, made visible
    assert not (root / "csrc/aten/ops/abs.cpp").exists()  # and the add-op was rolled back
