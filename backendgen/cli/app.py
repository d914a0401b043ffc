"""The `backendgen` command line: parses arguments, calls `backendgen.api`, shows the outcome
(backendgen.cli.render; the options several commands share are in backendgen.cli.options).

Errors from the library (`BackendgenError`) become one line on stderr and the exit code they
carry (2 bad input, 1 build or test failure); `--debug` shows the traceback instead. Nothing
heavy (torch, torchgen, cookiecutter) is imported before a command runs.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

import typer

from backendgen import __version__
from backendgen.cli.options import KeepOnFailureOption, NoBuildOption, ProjectOption

app = typer.Typer(
    name="backendgen",
    help="Generate, extend and check out-of-tree PyTorch backends on the PrivateUse1 dispatch key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: typer's rich help imports a Markdown parser (~0.15 s per call)
)
_state = {"debug": False, "quiet": False}


def _out(stderr: bool = False):
    """Where every line of the CLI goes (backendgen.cli.output: outside text is shown verbatim)."""
    from backendgen.cli.output import Output

    return Output(stderr=stderr)


def _reporter():
    from backendgen.cli.progress import ConsoleReporter

    return ConsoleReporter(_out(), quiet=_state["quiet"])


def _handles_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from backendgen.plumbing.errors import BackendgenError

        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except BackendgenError as e:
            if _state["debug"]:
                raise
            from backendgen.cli.output import styled

            err = _out(stderr=True)
            err.print(styled("error:", "red"), " ", str(e))
            if getattr(e, "hint", None):
                err.print("  ", e.hint)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (backendgen.plumbing.interrupt)
            from backendgen.plumbing import interrupt

            why = f" by {e.args[0]}" if isinstance(e, interrupt.Interrupted) else ""
            _out(stderr=True).print(f"interrupted{why}; rolled back: nothing was left half-written")
            raise typer.Exit(interrupt.exit_code(e)) from None
        except Exception as e:  # a bug in backendgen: say so in one line
            if _state["debug"]:
                raise
            _out(stderr=True).print(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


def _version(value: bool):
    if value:
        typer.echo(f"backendgen {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors and the final line.")] = False,
):
    _state["debug"] = debug
    _state["quiet"] = quiet


@app.command(short_help="Generate a backend repository, build it and run its tests.")
@_handles_errors
def new(
    name: Annotated[str, typer.Argument(help="Device name: lower-case letters and _ (torch.device(NAME)).")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Project directory [default: ./torch-NAME].")
    ] = None,
    package: Annotated[str | None, typer.Option(help="Python package name [default: torch_NAME].")] = None,
    devices: Annotated[int, typer.Option(help="Number of emulated devices.")] = 2,
    driver: Annotated[
        str,
        typer.Option(
            metavar="[emulator|minimal]",
            help="The device driver: emulator (an asynchronous emulated accelerator with every optional "
            "capability of driver.h) or minimal (driver.h's port API alone, synchronous: the start of a port).",
        ),
    ] = "emulator",
    no_build: Annotated[bool, typer.Option("--no-build", help="Render only.")] = False,
    no_test: Annotated[bool, typer.Option("--no-test", help="Build but do not run the generated tests.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier generated project (kept as a backup).")
    ] = False,
):
    """Emit a complete PrivateUse1 backend repository, build it and run its tests."""
    from backendgen import api
    from backendgen.cli import render

    res = api.new_backend(
        name,
        output,
        package=package,
        devices=devices,
        driver=driver,
        build_it=not no_build,
        test_it=not no_test,
        force=force,
        reporter=_reporter(),
    )
    render.new(res, _out(), quiet=_state["quiet"])


@app.command("add-op", short_help="Add kernels, registrations and tests for operators.")
@_handles_errors
def add_op(
    ops: Annotated[
        list[str],
        typer.Argument(
            help="Operators: aten::mul.Tensor, mul.Tensor or mul; or DEVICE::NAME, an operator of this backend."
        ),
    ],
    project: ProjectOption = None,
    schema: Annotated[
        str | None,
        typer.Option(
            "--schema", help='Schema of a new DEVICE::NAME operator, e.g. "(Tensor x, float alpha=1.0) -> Tensor".'
        ),
    ] = None,
    body: Annotated[
        str | None,
        typer.Option(
            "--body",
            help="What a new DEVICE::NAME operator computes: a C++ expression of ATen operators over its "
            'arguments, e.g. "x * alpha".',
        ),
    ] = None,
    autograd: Annotated[
        bool,
        typer.Option(
            "--autograd",
            help="DEVICE::NAME: add a backward (torch::autograd::Function); aten::OP: replace "
            "PyTorch's derivative on the device.",
        ),
    ] = False,
    no_build: NoBuildOption = False,
    no_test: Annotated[bool, typer.Option("--no-test", help="Build but do not run the new tests.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the files that would be written.")] = False,
    keep_on_failure: KeepOnFailureOption = False,
):
    """Add a correctly-typed kernel, its registration and its test for each operator."""
    from backendgen import api
    from backendgen.cli import render

    res = api.add_ops(
        ops,
        project,
        schema=schema,
        body=body,
        autograd=autograd,
        build_it=not no_build,
        test_it=not no_test,
        dry_run=dry_run,
        keep_on_failure=keep_on_failure,
        reporter=_reporter(),
    )
    render.add_op(res, _out(), dry_run=dry_run)


@app.command("remove-op", short_help="Remove kernels that add-op wrote (kernel, test, registration, record).")
@_handles_errors
def remove_op(
    ops: Annotated[
        list[str],
        typer.Argument(
            help="Operators as add-op was given them or as recorded: cholesky, aten::abs.out, DEVICE::NAME."
        ),
    ],
    project: ProjectOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also remove a kernel file edited by hand (a copy is kept beside it).")
    ] = False,
    autograd: Annotated[
        bool,
        typer.Option("--autograd", help="Remove the autograd override of each aten:: operator (add-op --autograd)."),
    ] = False,
):
    """Remove the kernel file, its test, its registration and its record for each operator, in one
    transaction; e.g. for an operator the installed torch removed. Rebuild afterwards (backendgen build)."""
    from backendgen import api
    from backendgen.cli import render

    res = api.remove_ops(ops, project, force=force, autograd=autograd)
    render.remove_op(res, _out())


@app.command("build", short_help="Rebuild after an edit (ninja and the link alone when possible).")
@_handles_errors
def build_cmd(
    project: ProjectOption = None,
    test: Annotated[bool, typer.Option("--test", help="Run the project's tests after building.")] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Go through setup.py even when ninja and the link would do.")
    ] = False,
    wheel: Annotated[
        bool,
        typer.Option(
            "--wheel", help="Build a wheel for the installed torch, repaired to a manylinux tag (auditwheel)."
        ),
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="With --wheel: where the wheel goes [default: the project's dist/].")
    ] = None,
    torch_label: Annotated[
        bool,
        typer.Option(
            "--torch-label",
            help="With --wheel: version X+torchA.B.C (not for PyPI: wheels for several torches side by side).",
        ),
    ] = False,
):
    """Rebuild the backend after editing it: ninja and the link alone while what shaped the last
    setup.py build is unchanged (a new kernel file included), else through setup.py, saying why.
    With --wheel: the distributable, pinned to the installed torch (docs/user-guide.md, "Shipping wheels")."""
    from backendgen import api
    from backendgen.cli import render
    from backendgen.plumbing.errors import UserError

    if wheel:
        if test or full:
            raise UserError("--wheel builds the wheel only: run `backendgen build --test` first, then --wheel")
        render.wheel(api.build_wheel(project, out=out, torch_label=torch_label, reporter=_reporter()), _out())
        return
    if out or torch_label:
        raise UserError("--out and --torch-label go with --wheel")
    render.build(api.build_backend(project, test_it=test, full=full, reporter=_reporter()), _out())


# `test`'s own options, declared before the command so that it reads as what it does (the options
# several commands share are in cli/options.py): the opt-in suites, the conformance suite's (--opinfo),
# --pytorch-tests' (its FILEs too)
_OpInfo = Annotated[
    bool,
    typer.Option("--opinfo", help="Also run the conformance suite: PyTorch's OpInfo database, device against CPU."),
]
_Compile = Annotated[
    bool, typer.Option("--compile", help="Also run the torch.compile tests: compiled against eager on the device.")
]
_Distributed = Annotated[
    bool,
    typer.Option(
        "--distributed",
        help="Also run the multi-process tests: the collective backend on 2 and 4 processes, DDP, FSDP, torchrun.",
    ),
]
_Models = Annotated[
    bool,
    typer.Option(
        "--models",
        help="Also run the model suite: real architectures trained on the device against the CPU, eager and compiled.",
    ),
]
_Patterns = Annotated[
    list[str] | None,
    typer.Option("-k", help="Only OpInfos whose name contains PATTERN or matches it as a glob (repeatable)."),
]
_Dtypes = Annotated[
    list[str] | None,
    typer.Option("--dtype", help="A torch dtype name, e.g. float32, int64 (repeatable) [default: float32]."),
]
_Samples = Annotated[
    int | None, typer.Option("--samples", help="Samples per op and variant [default: the suite's, 3].")
]
_Workers = Annotated[int | None, typer.Option("--workers", help="Worker processes [default: one per core].")]
_Strict = Annotated[bool, typer.Option("--strict", help="A listed expected failure that passes now fails the run.")]
_WriteExpected = Annotated[
    Path | None,
    typer.Option(
        "--write-expected",
        help="Write the expected-failure list this run calls for (new failures with reason UNEXPLAINED) to FILE.",
    ),
]
_PytorchTestFiles = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="FILE[=EXPR]",
        help="With --pytorch-tests: test files of DIR (test_view_ops.py; nn/test_pooling.py); "
        "FILE=EXPR runs the tests pytest's -k EXPR selects.",
        show_default=False,
    ),
]
_PytorchTests = Annotated[
    Path | None,
    typer.Option(
        "--pytorch-tests",
        metavar="DIR",
        help="Instead, run PyTorch's device-generic test FILEs of DIR (a PyTorch checkout's test/ at the "
        "installed torch's release) on the CPU and on the device, each in its own process, and compare.",
    ),
]
_Timeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        help="With --pytorch-tests: the longest one test process may run; the test it was running is "
        "reported as crashed and the rest of the file runs [default: 1800].",
    ),
]
_PytorchTestsJson = Annotated[
    bool, typer.Option("--json", help="With --pytorch-tests: the whole report as JSON on stdout.")
]


@app.command(
    "test",
    short_help="Run the project's tests; --opinfo: the OpInfo conformance suite; "
    "--compile: torch.compile's tests; --distributed: multi-process tests; --models: the model suite; "
    "--pytorch-tests: PyTorch's own device-generic test files.",
)
@_handles_errors
def test_cmd(
    files: _PytorchTestFiles = None,
    project: ProjectOption = None,
    opinfo: _OpInfo = False,
    torch_compile: _Compile = False,
    distributed: _Distributed = False,
    models: _Models = False,
    patterns: _Patterns = None,
    dtypes: _Dtypes = None,
    samples: _Samples = None,
    workers: _Workers = None,
    strict: _Strict = False,
    write_expected: _WriteExpected = None,
    pytorch_tests: _PytorchTests = None,
    timeout: _Timeout = None,
    json_out: _PytorchTestsJson = False,
):
    """Run the project's tests; with --opinfo also its conformance suite (one summary line per
    variant and dtype, then the first unexpected failure of each op); with --compile also its
    torch.compile tests (tests/test_compile.py); with --distributed also its multi-process tests
    (tests/distributed); with --models also its model suite (tests/models). With --pytorch-tests DIR
    instead, PyTorch's own device-generic test files: per file, the tests that pass on the CPU and
    what their device twins do (docs/conformance.md)."""
    from backendgen import api
    from backendgen.cli import render
    from backendgen.plumbing.errors import UserError

    if pytorch_tests is not None:
        others = {
            "--opinfo": opinfo,
            "--compile": torch_compile,
            "--distributed": distributed,
            "--models": models,
            "-k": patterns,
            "--dtype": dtypes,
            "--samples": samples is not None,
            "--workers": workers is not None,
            "--strict": strict,
            "--write-expected": write_expected is not None,
        }
        given = [name for name, on in others.items() if on]
        if given:
            raise UserError(f"--pytorch-tests runs PyTorch's test files alone: drop {', '.join(given)}")
        _pytorch_tests(pytorch_tests, files or [], project, timeout=timeout, json_out=json_out)
        return
    given = [name for name, on in (("FILE", files), ("--timeout", timeout is not None), ("--json", json_out)) if on]
    if given:
        raise UserError(f"{' and '.join(given)} go{'es' if len(given) == 1 else ''} with --pytorch-tests DIR")
    res = api.test_backend(
        project,
        opinfo=opinfo,
        opt_in=[
            name for name, on in (("compile", torch_compile), ("distributed", distributed), ("models", models)) if on
        ],
        patterns=patterns,
        dtypes=dtypes,
        samples=samples,
        workers=workers,
        strict=strict,
        write_expected=write_expected,
        reporter=_reporter(),
    )
    render.test(res, _out())
    raise typer.Exit(res.exit_code)


def _pytorch_tests(tests_dir: Path, files: list[str], project: Path | None, *, timeout, json_out: bool):
    import json

    from backendgen import api
    from backendgen.cli.progress import ConsoleReporter

    # with --json, stdout is the report alone: the progress lines go to stderr
    reporter = ConsoleReporter(_out(stderr=True), quiet=_state["quiet"]) if json_out else _reporter()
    kwargs = {} if timeout is None else {"timeout": timeout}
    report = api.run_pytorch_tests(tests_dir, files, project, reporter=reporter, **kwargs)
    if json_out:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        from backendgen.cli import render

        render.pytorch_tests(report, _out())
    raise typer.Exit(report.exit_code)


@app.command("ops", short_help="List operators: native, CPU fallback or a default kernel.")
@_handles_errors
def ops_cmd(
    pattern: Annotated[str | None, typer.Argument(help="Glob or substring, e.g. 'mul*' or 'layer_norm'.")] = None,
    project: ProjectOption = None,
    required: Annotated[bool, typer.Option("--required", help="Only ops that need a backend kernel.")] = False,
):
    """List operators and, for this project (outside one: a new project from the current template), whether each
    is native, falls back to CPU, has a default kernel, or has no CPU kernel for the fallback to run (CUDA-only
    operators: they need a kernel written by hand)."""
    from backendgen import api
    from backendgen.cli import render

    render.ops(api.list_ops(pattern, project, required=required), _out())


amp_app = typer.Typer(
    help="Show or change the autocast (AMP) table: the policy torch.autocast applies to each operator.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(amp_app, name="amp")


@amp_app.command("list", short_help="Show the autocast table.")
@_handles_errors
def amp_list_cmd(
    project: ProjectOption = None,
):
    """Show each operator's autocast policy; operators not listed run in the dtypes they are given."""
    from backendgen import api
    from backendgen.cli import render

    render.amp_list(api.amp_list(project), _out())


@amp_app.command("set", short_help="Set an operator's autocast policy, rebuild and test it.")
@_handles_errors
def amp_set_cmd(
    op: Annotated[str, typer.Argument(help="Operator: aten::mm, softmax.int, ...")],
    policy: Annotated[
        str, typer.Argument(help="lower_precision_fp, fp32, promote, fp32_set_opt_dtype, or none (take it out).")
    ],
    project: ProjectOption = None,
    no_build: NoBuildOption = False,
    no_test: Annotated[bool, typer.Option("--no-test", help="Build but do not run the policy's test.")] = False,
):
    """Set OP's autocast policy in backendgen.json and the generated registration file, rebuild, and
    run the test that the policy takes effect under torch.autocast; a failure leaves the project as it was."""
    from backendgen import api
    from backendgen.cli import render

    res = api.amp_set(op, policy, project, build_it=not no_build, test_it=not no_test, reporter=_reporter())
    render.amp_set(res, _out())


@app.command(short_help="Check the backend against the installed torch.")
@_handles_errors
def check(
    project: ProjectOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too.")] = False,
    ops: Annotated[bool, typer.Option("--ops", help="List native and fallback ops.")] = False,
    accept: Annotated[
        bool,
        typer.Option("--accept", help="If the check passes, record that the project now targets the installed torch."),
    ] = False,
):
    """Check the backend against the installed torch: schema drift, APIs, the built extension, coverage."""
    import json

    from backendgen import api

    if not json_out:  # the report's table module loads while the check waits for its torch probe
        import importlib
        import threading

        threading.Thread(target=importlib.import_module, args=("rich.table",), daemon=True).start()
    report = api.check(project, strict=strict, list_ops=ops, accept=accept)
    if json_out:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        from backendgen.cli import render

        render.check(report, _out(), accept=accept)
    raise typer.Exit(report.exit_code)


@app.command(
    "update",
    short_help="Carry the project to the current template (3-way merge; no hand edit lost); "
    "--torch: to the installed torch's signatures.",
)
@_handles_errors
def update_cmd(
    project: ProjectOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the diff that would be applied; change nothing.")
    ] = False,
    torch: Annotated[
        bool,
        typer.Option(
            "--torch",
            help="Also re-derive every recorded operator's signature from the installed torch, "
            "fix kernel signature lines where only types changed, then check.",
        ),
    ] = False,
    no_build: Annotated[
        bool, typer.Option("--no-build", help="Write the merged files only (no build, no tests).")
    ] = False,
    no_test: Annotated[bool, typer.Option("--no-test", help="Build but do not run the tests.")] = False,
    allow_dirty: Annotated[
        bool, typer.Option("--allow-dirty", help="Go on although the project's git work tree has uncommitted changes.")
    ] = False,
    keep_on_failure: KeepOnFailureOption = False,
):
    """Bring a project generated from an earlier template to the current one. Files backendgen writes
    from backendgen.json are rewritten; every other file of the template is merged 3-way (the older
    template, your project, the current template), so no hand edit is lost; kernels add-op wrote get
    the current kernel shape the same way. A conflict is left with markers, listed, and the command
    exits 1 (and again until the markers are gone); otherwise it builds and runs the tests. One
    transaction: a failure or Ctrl-C leaves the project as it was."""
    from backendgen import api
    from backendgen.cli import render

    res = api.update_project(
        project,
        dry_run=dry_run,
        torch_signatures=torch,
        build_it=not no_build,
        test_it=not no_test,
        allow_dirty=allow_dirty,
        keep_on_failure=keep_on_failure,
        reporter=_reporter(),
    )
    render.update(res, _out())
    raise typer.Exit(res.exit_code)


@app.command(
    "profile",
    short_help="Run a script; rank the operators that ran on the CPU fallback, with add-op commands.",
    context_settings={"allow_interspersed_args": False},  # everything after SCRIPT is the script's
)
@_handles_errors
def profile_cmd(
    script: Annotated[
        Path,
        typer.Argument(metavar="SCRIPT", help="The Python script to run (options of backendgen profile go before it)."),
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments of the script, passed through as they are.")
    ] = None,
    project: ProjectOption = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Machine-readable report on stdout (the script's stdout goes to stderr).")
    ] = False,
):
    """Run SCRIPT [ARGS...] with this Python and the project's backend loaded (as `python SCRIPT ARGS`
    would), then list the operators that ran on the CPU fallback, ranked by time and calls, each
    with the `backendgen add-op` argument that makes it native, and one command that adds them all.
    Exits 1 if the script failed (its profile is still shown)."""
    import json

    from backendgen import api

    res = api.profile(script, args or [], project, stdout_to_stderr=json_out)
    if json_out:
        typer.echo(json.dumps(res.to_json(), indent=2))
    else:
        from backendgen.cli import render

        render.profile(res, _out())
    if res.exit_status != 0:
        raise typer.Exit(1)


def main() -> None:
    from backendgen.cli import output
    from backendgen.plumbing import interrupt

    interrupt.install()  # SIGTERM and SIGHUP take Ctrl-C's path: the one place they are handled
    output.degrade_streams()  # a terminal that cannot show ✓ gets backslash escapes, not a crash
    try:
        app()
    except SystemExit as e:
        # click reports usage errors with exit code 2 already; keep whatever code was chosen
        sys.exit(e.code)
