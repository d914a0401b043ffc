"""PyTorch's own device-generic tests against a backend (`backendgen test --pytorch-tests`,
docs/conformance.md).

A device-generic test file of PyTorch's `test/` folder calls `instantiate_device_type_tests(TestFoo,
globals())`, which makes `TestFooCPU` (tests `test_add_cpu_float32`) and, when the PrivateUse1
backend is available, `TestFooMYCHIP` or `TestFooPRIVATEUSE1` (torch names the first class it makes
before the backend's test base was set up `PRIVATEUSE1`; tests `test_add_mychip_float32`). Each file
runs twice, each side in pytest processes of its own, in the file's directory (PyTorch's tests import
their siblings): on the CPU with the backend's autoload off, then on the device with it on;
`PYTORCH_TESTING_DEVICE_ONLY_FOR` makes torch instantiate one side only and the plugin
`backendgen.programs.pytest_progress` keeps only that side's classes. The plugin writes each test's
start, outcome and end to a progress file as it happens, so a process that dies (a segfault, an
abort, a timeout: its process group is killed) names the test that was running: it is recorded as
crashed and the file runs again without it and without the tests that finished, at most
`max_crashes` times per side. Every device test is then paired with its CPU twin (the device in the
class and test name mapped to the CPU) and the file's `FileResult` says: how many pass on the CPU;
of those, what they do on the device; the tests that fail on the CPU too (skew: the checkout and
the installed torch disagree, or the test needs what this machine lacks), reported apart; the
device's tests without a CPU twin; the most frequent failure messages, grouped.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from backendgen.plumbing import interrupt
from backendgen.plumbing.environment import subprocess_env
from backendgen.plumbing.errors import UserError
from backendgen.plumbing.files import write_atomic
from backendgen.plumbing.progress import Reporter

PLUGIN = "backendgen.programs.pytest_progress"
DEFAULT_TIMEOUT = 1800.0  # seconds one pytest process may run
MAX_CRASHES = 25  # per file and side: after that many crashed processes the rest is not run
TOP_MESSAGES = 10  # grouped failure messages kept per file

STATUSES = ("passed", "failed", "errored", "skipped", "crashed", "not_run")
BAD = ("failed", "errored", "crashed")  # on the device, for a test that passes on the CPU: a backend failure


@dataclass(frozen=True)
class FileSpec:
    """One file to run: `name` as given (relative to the tests folder), and the `-k` expression of `FILE=EXPR`."""

    path: Path
    name: str
    expr: str | None = None


@dataclass(frozen=True)
class Side:
    """One side of a device-generic test file: the CPU, or the device."""

    name: str  # "cpu" or the device's name; in test names (`test_add_cpu_float32`)
    only_for: str  # PYTORCH_TESTING_DEVICE_ONLY_FOR
    class_suffixes: tuple[str, ...]  # the suffixes of its classes' names (`TestFooCPU`)
    autoload: str  # TORCH_DEVICE_BACKEND_AUTOLOAD: the CPU is the reference, without the backend


def cpu_side() -> Side:
    return Side("cpu", "cpu", ("CPU",), "0")


def device_side(device: str) -> Side:
    return Side(device, device, (device.upper(), "PRIVATEUSE1"), "1")


@dataclass
class Outcome:
    status: str  # one of STATUSES
    message: str = ""  # the failure's, error's, skip's or crash's message


@dataclass
class Run:
    """One pytest process."""

    side: str
    attempt: int
    returncode: int | None  # None: killed after the timeout
    seconds: float
    log: Path

    def to_json(self) -> dict:
        return {
            "side": self.side,
            "attempt": self.attempt,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 1),
            "log": str(self.log),
        }


@dataclass
class SideResult:
    side: Side
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # full node id -> outcome, in the order they ran
    collected: list[str] | None = None  # None: the first process never finished collecting
    runs: list[Run] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what went wrong outside a test


def _status(reports: list[dict]) -> Outcome:
    """A test's outcome from its setup, call and teardown reports (pytest-rerunfailures' reruns ignored)."""
    by_when = {r["when"]: r for r in reports if r["outcome"] != "rerun"}
    setup, call, teardown = by_when.get("setup"), by_when.get("call"), by_when.get("teardown")
    if setup is not None and setup["outcome"] == "failed":
        return Outcome("errored", setup["message"])
    if call is not None and call["outcome"] == "failed":
        return Outcome("failed", call["message"])
    if teardown is not None and teardown["outcome"] == "failed":
        return Outcome("errored", teardown["message"])
    for r in (setup, call):  # an expected failure is a skip; one that passes unexpectedly (not strict) passed
        if r is not None and r["outcome"] == "skipped":
            return Outcome("skipped", r["message"])
    if call is not None and call["outcome"] == "passed":
        return Outcome("passed")
    return Outcome("errored", "the test reported no outcome")


def read_progress(path: Path) -> dict:
    """What one process's progress file says: collected ids (None: collection did not finish), the
    outcomes of the tests that finished, the tests started and not finished, collection errors, the
    exit status pytest reached (None: it died first)."""
    collected, started, finished, errors, end = None, [], set(), [], None
    reports: dict[str, list[dict]] = {}
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line cut short by the crash
        if "collected" in ev:
            collected = list(ev["collected"])
        elif "collect_error" in ev:
            errors.append(f"collecting {ev['collect_error'] or 'the file'} failed: {first_line(ev['message'])}")
        elif "start" in ev:
            started.append(ev["start"])
        elif "report" in ev:
            reports.setdefault(ev["report"], []).append(ev)
        elif "finish" in ev:
            finished.add(ev["finish"])
        elif "end" in ev:
            end = ev["end"]
    outcomes = {nid: _status(reports.get(nid, [])) for nid in started if nid in finished}
    unfinished = [nid for nid in started if nid not in finished]
    return {"collected": collected, "outcomes": outcomes, "unfinished": unfinished, "errors": errors, "end": end}


def _died(returncode: int | None, timeout: float) -> str:
    if returncode is None:
        return f"timed out: the process ran longer than {timeout:g} s and was killed"
    if returncode < 0:
        try:
            return f"the process was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"the process was killed by signal {-returncode}"
    return f"the process exited with status {returncode}"


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if len(lines) > 1 else ""  # the first line is the command


def _run_pytest(
    spec: FileSpec, side: Side, attempt: int, out: Path, timeout: float, deselect: list[str]
) -> tuple[Run, Path]:
    stem = f"{side.name}-{attempt}"
    log, progress, skip = out / f"{stem}.log", out / f"{stem}.jsonl", out / f"{stem}.deselect"
    progress.unlink(missing_ok=True)
    skip.write_text("".join(f"{nid}\n" for nid in deselect))
    cmd = [sys.executable, "-m", "pytest", spec.path.name, "-p", PLUGIN, "-p", "no:cacheprovider", "-q"]
    if spec.expr:
        cmd += ["-k", spec.expr]
    env = subprocess_env(autoload=side.autoload)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(
        {
            "PYTORCH_TESTING_DEVICE_ONLY_FOR": side.only_for,
            "BACKENDGEN_PROGRESS": str(progress),
            "BACKENDGEN_KEEP_CLASSES": ",".join(side.class_suffixes),
            "BACKENDGEN_DESELECT": str(skip),
        }
    )
    env.pop("PYTORCH_TESTING_DEVICE_EXCEPT_FOR", None)
    start = time.monotonic()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + f"  # in {spec.path.parent}, {side.name}\n")
        fh.flush()
        try:
            # its own process group: a timeout or an interrupt stops it with everything it started
            proc = interrupt.run(
                cmd,
                cwd=spec.path.parent,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    return Run(side.name, attempt, returncode, time.monotonic() - start, log), progress


def run_side(spec: FileSpec, side: Side, out: Path, *, timeout: float, max_crashes: int = MAX_CRASHES) -> SideResult:
    """Run one side of one file to the end: after a crash, again without the tests that finished
    and the one that crashed (at most `max_crashes` crashes)."""
    out.mkdir(parents=True, exist_ok=True)
    res = SideResult(side)
    crashes = 0
    while True:
        run, progress = _run_pytest(spec, side, len(res.runs), out, timeout, list(res.outcomes))
        res.runs.append(run)
        got = read_progress(progress)
        if got["collected"] is not None:
            if res.collected is None:
                res.collected = got["collected"]
            else:
                known = set(res.collected)
                res.collected += [nid for nid in got["collected"] if nid not in known]
        res.outcomes.update(got["outcomes"])
        res.errors += [e for e in got["errors"] if e not in res.errors]
        clean = run.returncode is not None and run.returncode >= 0 and got["end"] is not None
        if clean:
            if got["end"] not in (0, 1, 5) and not got["errors"]:  # 2 interrupted, 3 internal error, 4 usage
                res.errors.append(f"pytest exited with status {got['end']}: {_last_line(run.log)}")
            break
        why = _died(run.returncode, timeout)
        if not got["unfinished"]:
            when = "while collecting" if got["collected"] is None else "between tests"
            res.errors.append(f"{why} {when} ({_last_line(run.log) or 'see ' + str(run.log)})")
            break
        for nid in got["unfinished"]:
            res.outcomes[nid] = Outcome("crashed", why)
        crashes += 1
        remaining = [nid for nid in res.collected or [] if nid not in res.outcomes]
        if not remaining:
            break
        if crashes >= max_crashes:
            res.errors.append(
                f"stopped after {crashes} crashed processes: {len(remaining)} tests not run "
                "(narrow the file with FILE=EXPR)"
            )
            break
    for nid in res.collected or []:
        res.outcomes.setdefault(nid, Outcome("not_run"))
    return res


# ---- pairing and the report ----


def _short(nodeid: str) -> str:
    """`path/test_x.py::TestFooCPU::test_add_cpu` -> `TestFooCPU::test_add_cpu` (the file is the report's key)."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def twin_key(nodeid: str, side: Side) -> str | None:
    """The id of a test with its side taken out (`TestFoo<>::test_add_<>_float32`), shared with its
    twin on the other side; None for a test of no class of `side`."""
    parts = _short(nodeid).split("::")
    if len(parts) != 2:
        return None
    cls, name = parts
    suffix = next((s for s in side.class_suffixes if cls.endswith(s)), None)
    if suffix is None:
        return None
    tokens = ("cpu",) if side.name == "cpu" else (side.name, "privateuse1")
    matches = [m for t in tokens for m in re.finditer(rf"_{re.escape(t)}(?=_|$)", name)]
    if matches:  # the device comes after the test's own parameters and before its dtypes: the last one
        last = max(matches, key=lambda m: m.start())
        name = name[: last.start()] + "_<>" + name[last.end() :]
    return f"{cls[: len(cls) - len(suffix)]}<>::{name}"


def first_line(message: str) -> str:
    return next((ln.strip() for ln in message.splitlines() if ln.strip()), "")


def normalise(message: str, device: str) -> str:
    """A failure message's first line with what differs between tests collapsed: addresses, numbers,
    device names (`mychip:0`, `cpu`), so that one cause is one group."""
    text = first_line(message)
    text = re.sub(r"0x[0-9a-fA-F]+", "<addr>", text)
    text = re.sub(rf"\b(?:{re.escape(device)}|privateuse1)(?::\d+)?\b", "<device>", text, flags=re.IGNORECASE)
    text = re.sub(r"(?<![A-Za-z_\d])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", "N", text)
    text = re.sub(r"\s+", " ", text)
    return text[:200]


def _counts(outcomes) -> dict[str, int]:
    c = Counter(o.status for o in outcomes)
    return {s: c.get(s, 0) for s in STATUSES}


@dataclass
class FileResult:
    spec: FileSpec
    device: str
    cpu: SideResult
    dev: SideResult
    cpu_passed: int = 0
    on_device: dict[str, int] = field(default_factory=dict)  # of the CPU-passing tests: their status on the device
    failures: list[dict] = field(default_factory=list)  # {test, status, message}: CPU-passing, bad on the device
    crashes: list[dict] = field(default_factory=list)  # {side, test, message}
    messages: list[dict] = field(default_factory=list)  # {message, count, example}: failures grouped
    skew: list[dict] = field(default_factory=list)  # {test, cpu, cpu_message, device}: the CPU fails too
    # device tests without a CPU reference: no CPU twin, or one skipped there (onlyPRIVATEUSE1, skipCPUIf)
    device_only: dict[str, int] = field(default_factory=dict)
    device_only_failures: list[dict] = field(default_factory=list)
    cpu_only: int = 0  # CPU tests without a device twin (not instantiated for the device)

    @property
    def errors(self) -> list[str]:
        return [f"{s.side.name}: {e}" for s in (self.cpu, self.dev) for e in s.errors]

    @property
    def device_broken(self) -> bool:
        """The device side could not run a file the CPU runs: it died outside a test, or collected nothing."""
        cpu_ran = any(o.status == "passed" for o in self.cpu.outcomes.values())
        return cpu_ran and (bool(self.dev.errors) or self.dev.collected == [])

    @property
    def ok(self) -> bool:
        return not any(self.on_device.get(s) for s in (*BAD, "not_run")) and not self.device_broken

    def to_json(self) -> dict:
        return {
            "file": self.spec.name,
            "expr": self.spec.expr,
            "ok": self.ok,
            "device_broken": self.device_broken,
            "cpu": _counts(self.cpu.outcomes.values()),
            "device": _counts(self.dev.outcomes.values()),
            "cpu_passed": self.cpu_passed,
            "on_device": self.on_device,
            "failures": self.failures,
            "crashes": self.crashes,
            "messages": self.messages,
            "skew": self.skew,
            "device_only": self.device_only,
            "device_only_failures": self.device_only_failures,
            "cpu_only": self.cpu_only,
            "errors": self.errors,
            "runs": [r.to_json() for r in (*self.cpu.runs, *self.dev.runs)],
        }

    def lines(self) -> list[str]:
        """The file's part of the text report."""
        dev = self.device
        on = self.on_device
        what = f"{self.spec.name}" + (f" (-k {self.spec.expr})" if self.spec.expr else "")
        out = [
            f"{what}: {self.cpu_passed} pass on the CPU; on {dev}: {on['passed']} passed, {on['failed']} failed, "
            f"{on['errored']} errored, {on['skipped']} skipped, {on['crashed']} crashed"
            + (f", {on['not_run']} not run" if on["not_run"] else "")
        ]
        for c in self.crashes:
            out.append(f"  crashed on {c['side']}: {c['test']}: {c['message']}")
        for m in self.messages:
            out.append(f"  {m['count']}× {m['message']}  (e.g. {m['example']})")
        if self.skew:
            shown = ", ".join(f"{s['test']} ({s['cpu']} on the CPU)" for s in self.skew[:5])
            more = f" and {len(self.skew) - 5} more" if len(self.skew) > 5 else ""
            out.append(f"  skew, failing on the CPU too (not counted): {len(self.skew)}: {shown}{more}")
        if any(self.device_only.values()):
            d = self.device_only
            out.append(
                f"  {dev} only (no CPU twin, or skipped on the CPU; not counted): {d['passed']} passed, "
                f"{d['failed']} failed, {d['errored']} errored, {d['skipped']} skipped, {d['crashed']} crashed"
            )
            for f in self.device_only_failures[:5]:
                out.append(f"    {f['status']}: {f['test']}: {f['message']}")
        if self.cpu_only:
            out.append(f"  CPU only (not instantiated for {dev}): {self.cpu_only}")
        if self.cpu.collected == [] and not self.cpu.errors:
            out.append("  note: no CPU tests: is the file device-generic, and does EXPR select any of its tests?")
        out += [f"  error: {e}" for e in self.errors]
        if self.device_broken and not self.dev.errors:
            out.append(f"  error: no {dev} tests were collected: is torch.{dev}.is_available() true?")
        return out


def compare(spec: FileSpec, cpu: SideResult, dev: SideResult) -> FileResult:
    """Pair every device test with its CPU twin and count."""
    res = FileResult(spec, dev.side.name, cpu, dev)
    cpu_by_key = {}
    for nid, o in cpu.outcomes.items():
        key = twin_key(nid, cpu.side)
        if key is not None:
            cpu_by_key[key] = o
    on_device, device_only, paired = Counter(), Counter(), set()
    groups: dict[str, list[str]] = {}
    for nid, o in dev.outcomes.items():
        key = twin_key(nid, dev.side)
        twin = cpu_by_key.get(key) if key is not None else None
        test = _short(nid)
        if twin is not None:
            paired.add(key)
        if twin is None or twin.status in ("skipped", "not_run"):
            device_only[o.status] += 1
            if o.status in BAD:
                res.device_only_failures.append({"test": test, "status": o.status, "message": first_line(o.message)})
            continue
        if twin.status == "passed":
            res.cpu_passed += 1
            on_device[o.status] += 1
            if o.status in BAD:
                res.failures.append({"test": test, "status": o.status, "message": first_line(o.message)})
                if o.status != "crashed":
                    groups.setdefault(normalise(o.message, res.device), []).append(test)
        else:
            res.skew.append(
                {"test": test, "cpu": twin.status, "cpu_message": first_line(twin.message), "device": o.status}
            )
    res.on_device = {s: on_device.get(s, 0) for s in STATUSES}
    res.device_only = {s: device_only.get(s, 0) for s in STATUSES}
    res.cpu_only = sum(1 for key in cpu_by_key if key not in paired)
    for side in (cpu, dev):
        for nid, o in side.outcomes.items():
            if o.status == "crashed":
                res.crashes.append({"side": side.side.name, "test": _short(nid), "message": o.message})
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:TOP_MESSAGES]
    res.messages = [{"message": m, "count": len(tests), "example": tests[0]} for m, tests in ranked]
    return res


@dataclass
class Report:
    device: str
    tests_dir: Path
    torch: str | None
    timeout: float
    out: Path  # where the logs and report.json are
    files: list[FileResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def totals(self) -> dict:
        on = Counter()
        for f in self.files:
            on.update(f.on_device)
        return {
            "cpu_passed": sum(f.cpu_passed for f in self.files),
            "on_device": {s: on.get(s, 0) for s in STATUSES},
            "skew": sum(len(f.skew) for f in self.files),
            "device_only": sum(sum(f.device_only.values()) for f in self.files),
        }

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "tests_dir": str(self.tests_dir),
            "torch": self.torch,
            "timeout": self.timeout,
            "ok": self.ok,
            "totals": self.totals(),
            "files": [f.to_json() for f in self.files],
        }

    def lines(self) -> list[str]:
        out = [line for f in self.files for line in f.lines()]
        t = self.totals()
        on = t["on_device"]
        bad = sum(on[s] for s in (*BAD, "not_run"))
        verdict = "OK" if self.ok else "FAILED"
        files = f"{len(self.files)} file{'' if len(self.files) == 1 else 's'}"
        out.append(
            f"{files}: {t['cpu_passed']} pass on the CPU; on {self.device}: {on['passed']} passed, "
            f"{bad} failed, errored, crashed or not run, {on['skipped']} skipped; {t['skew']} skew: {verdict}"
        )
        return out


def parse_files(tests_dir: Path, args: list[str]) -> list[FileSpec]:
    """`FILE` or `FILE=EXPR` arguments, each FILE relative to `tests_dir` (`.py` may be left out)."""
    if not tests_dir.is_dir():
        raise UserError(f"no PyTorch tests folder {tests_dir} (--pytorch-tests DIR: a PyTorch checkout's test/)")
    if not args:
        raise UserError("name the test files to run after --pytorch-tests DIR, e.g. test_view_ops.py")
    specs = []
    for arg in args:
        name, eq, expr = arg.partition("=")
        if eq and not expr.strip():
            raise UserError(f"{arg}: FILE=EXPR needs an expression after '=' (pytest's -k)")
        path = tests_dir / name
        if not path.is_file() and not name.endswith(".py") and (tests_dir / f"{name}.py").is_file():
            path = tests_dir / f"{name}.py"
        if not path.is_file():
            raise UserError(f"no test file {name} in {tests_dir}")
        specs.append(FileSpec(path.resolve(), name, expr.strip() if eq else None))
    return specs


def _folder(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name.removesuffix(".py")) or "file"


def run(
    specs: list[FileSpec],
    device: str,
    out: Path,
    *,
    tests_dir: Path,
    timeout: float = DEFAULT_TIMEOUT,
    max_crashes: int = MAX_CRASHES,
    torch_version: str | None = None,
    reporter: Reporter | None = None,
) -> Report:
    """Run each file on the CPU and on `device`; logs under `out/NN-<file>/`, the report in
    `out/report.json` (`out` is emptied first)."""
    rep = reporter or Reporter()
    shutil.rmtree(out, ignore_errors=True)  # an earlier run's logs would read as this one's
    report = Report(device, tests_dir, torch_version, timeout, out)
    cpu, dev = cpu_side(), device_side(device)
    for i, spec in enumerate(specs):
        where = out / f"{i + 1:02d}-{_folder(spec.name)}"
        sides = []
        for side in (cpu, dev):
            with rep.step(f"{spec.name} on {side.name}"):
                sides.append(run_side(spec, side, where, timeout=timeout, max_crashes=max_crashes))
        report.files.append(compare(spec, *sides))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "report.json", json.dumps(report.to_json(), indent=2) + "\n")
    return report
