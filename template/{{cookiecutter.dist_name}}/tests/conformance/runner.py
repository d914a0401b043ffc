"""The conformance suite: PyTorch's own operator database (OpInfo), run on the {{ cookiecutter.device }} device and on
the CPU, compared. Run from the project's root:

    python -m tests.conformance.runner                      # float32, the default budget (about a minute on 2 cores)
    python -m tests.conformance.runner -k abs -k 'linalg.*' # only these OpInfos (substring, or a glob)
    python -m tests.conformance.runner --dtype float32 --dtype int64 --dtype float64 --samples 10
    python -m tests.conformance.runner --write-expected new.json   # the failures as an expected-failure list

(`pytest -m conformance` runs the default; `backendgen test --opinfo` runs it too.)

For every OpInfo that supports the dtype on the CPU, four variants (worker.py says exactly what
each compares): forward (as given and non-contiguous), backward, inplace (on non-contiguous
views with a storage offset) and out (into non-contiguous views of a sentinel-filled buffer);
after every call every input and out= tensor is compared whole: storage contents, sizes, strides,
storage offset. Results per (op, dtype, variant): pass, mismatch (values or geometry differ), error
(the device raised where the CPU did not), crash (the worker died), hang (a variant ran longer than
--timeout), skipped (not applicable, or the CPU itself raises for every sample).

The supervisor (this module) starts --workers processes (default: one per core), hands each an op
at a time, and reads their results as JSON lines; a worker that dies or hangs is recorded against
the op and variant it was running, and a fresh worker carries on with the rest (and with that
op's remaining variants after a crash).

expected_failures.json lists the failures that are known and explained (expectations.py says how
to read it). An unlisted failure fails the run (exit 1); a listed one that passes is reported as
fixed (exit 1 with --strict); an entry whose reason is UNEXPLAINED fails the run. Exit 2: bad
arguments or a broken list.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from tests.conformance import expectations

DEVICE = "{{ cookiecutter.device }}"
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected_failures.json"
VARIANTS = expectations.VARIANTS
DEFAULT_SAMPLES = 3
DEFAULT_TIMEOUT = 60.0


class BadInput(Exception):
    pass


class WorkerFailed(Exception):
    """A worker could not even start (the backend does not import, say)."""


# --- workers -------------------------------------------------------------------------------------

class Worker:
    """One worker process and the job it is running."""

    def __init__(self, number: int, log_dir: Path, hello: dict):
        self.number = number
        self.log_path = log_dir / f"worker-{number}.log"
        self.log = open(self.log_path, "wb")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.conformance.runner", "--worker"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
        )
        self.buffer = b""
        self.ready = False
        self.job = None  # dict: op, dtype, variants, samples
        self.done_variants: list[str] = []
        self.variant = None
        self.since = time.monotonic()
        self.send(hello)

    def send(self, obj: dict) -> bool:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def lines(self, data: bytes) -> list[dict]:
        self.buffer += data
        *complete, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in complete if line.strip()]

    def death(self) -> str:
        code = self.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self.log.flush()
        tail = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        last = next((ln for ln in reversed(tail) if "Warning" not in ln), "")
        return f"the worker died ({how})" + (f": {last[:200]}" if last else "") + f" [log: {self.log_path}]"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def run_jobs(dtypes: list[str], patterns: list[str], variants: list[str], samples: int, workers: int,
             timeout: float, log_dir: Path, progress) -> tuple[list[dict], int]:
    """Run every matching (op, dtype) on `workers` processes; return (results, number of ops)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    sel = selectors.DefaultSelector()
    pool: list[Worker] = []
    jobs: deque = deque()
    results: list[dict] = []
    catalogue = None
    started = 0

    def spawn(with_catalogue: bool) -> Worker:
        nonlocal started
        started += 1
        w = Worker(started, log_dir, {"dtypes": dtypes, "catalogue": with_catalogue})
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        pool.append(w)
        return w

    def retire(w: Worker) -> None:
        sel.unregister(w.proc.stdout)
        pool.remove(w)
        w.stop()

    def record(w: Worker, status: str, detail: str, rest_status: str | None, rest_detail: str = "") -> None:
        job = w.job
        failed = w.variant or next(v for v in job["variants"] if v not in w.done_variants)
        results.append({"op": job["op"], "dtype": job["dtype"], "variant": failed, "status": status, "detail": detail})
        rest = [v for v in job["variants"] if v not in w.done_variants and v != failed]
        if rest and rest_status is None:
            jobs.appendleft(dict(job, variants=rest))  # the op's other variants, on a fresh worker
        for v in rest if rest_status else []:
            results.append({"op": job["op"], "dtype": job["dtype"], "variant": v, "status": rest_status, "detail": rest_detail})

    try:
        spawn(True)
        for _ in range(workers - 1):
            spawn(False)
        while True:
            if catalogue is not None:
                for w in list(pool):
                    if w.ready and w.job is None and jobs:
                        job = jobs.popleft()
                        w.job, w.done_variants, w.variant, w.since = job, [], None, time.monotonic()
                        w.send(job)
                busy = [w for w in pool if w.job is not None]
                if not jobs and not busy:
                    break
                while jobs and len(pool) < workers:
                    spawn(False)
            for key, _ in sel.select(timeout=0.5):
                w = key.data
                data = os.read(w.proc.stdout.fileno(), 1 << 16)
                if not data:  # the worker died
                    if w.job is not None:
                        record(w, "crash", w.death(), None)
                    elif not w.ready:
                        raise WorkerFailed(f"a worker failed to start: {w.death()}")
                    retire(w)
                    continue
                for msg in w.lines(data):
                    event = msg["event"]
                    if event == "hello":
                        if msg.get("error"):
                            raise BadInput(msg["error"])
                        w.ready = True
                        if msg.get("ops") is not None:
                            catalogue = msg["ops"]
                            jobs.extend(_plan(catalogue, dtypes, patterns, variants, samples))
                            if not jobs and not any(_matches(o["op"], patterns) for o in catalogue):
                                raise BadInput(f"no OpInfo matches {' or '.join(patterns)}")
                    elif event == "start":
                        w.variant, w.since = msg["variant"], time.monotonic()
                    elif event == "result":
                        results.append({k: msg[k] for k in ("op", "dtype", "variant", "status", "detail", "samples", "seconds")})
                        w.done_variants.append(msg["variant"])
                        w.variant = None
                        progress(len(results))
                    elif event == "done":
                        w.job, w.variant = None, None
            now = time.monotonic()
            for w in list(pool):
                if w.job is not None and now - w.since > timeout:
                    record(w, "hang", f"still running after {timeout:.0f} s (killed)", "skipped",
                           "not run: an earlier variant of this op hung")
                    w.job = None
                    retire(w)
    finally:
        for w in list(pool):
            retire(w)
    ops = len({r["op"] for r in results})
    return results, ops


def _matches(op: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(op, p) if any(c in p for c in "*?[") else p in op for p in patterns)


def _plan(catalogue, dtypes, patterns, variants, samples):
    for dtype in dtypes:
        for entry in catalogue:
            if dtype in entry["dtypes"] and _matches(entry["op"], patterns):
                yield {"op": entry["op"], "dtype": dtype, "variants": variants, "samples": samples}


# --- reporting -----------------------------------------------------------------------------------

def summary_lines(judgement: expectations.Judgement, variants: list[str], dtypes: list[str]) -> list[str]:
    counts = judgement.counts()
    lines = []
    width = max(len(v) for v in variants)
    for dtype in dtypes:
        for variant in variants:
            c = counts.get((variant, dtype))
            if c is None:
                continue
            lines.append(
                f"{variant:<{width}} {dtype}: {c['pass']} pass, {c['fail']} fail ({c['mismatch']} mismatch, "
                f"{c['error']} error), {c['crash']} crash, {c['hang']} hang, {c['xfail']} xfail, "
                f"{c['fixed']} fixed, {c['skip']} skip"
            )
    return lines


def failure_lines(judgement: expectations.Judgement) -> list[str]:
    """The first unexpected failure of each op, one line each; fixed and unexplained entries."""
    lines, seen = [], {}
    for v in judgement.of("fail"):
        seen.setdefault(v.op, []).append(v)
    for op, fails in seen.items():
        first = fails[0]
        more = f" (and {len(fails) - 1} more)" if len(fails) > 1 else ""
        lines.append(f"FAIL {op} [{first.variant} {first.dtype}] {first.status}: {first.detail or ''}{more}")
    for v in judgement.of("fixed"):
        lines.append(f"FIXED {v.op} [{v.variant} {v.dtype}] passes now: remove it from the expected-failure list "
                     f"(entry for {v.entry.op}: {v.entry.reason[:80]})")
    for e in judgement.unexplained:
        lines.append(f"UNEXPLAINED expected failure {e.op} {','.join(e.variants)}: give it a reason in "
                     f"{EXPECTED.name} (or remove it)")
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.runner", description=__doc__.split("\n\n")[0])
    p.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN",
                   help="OpInfo names containing PATTERN, or matching it as a glob (repeatable)")
    p.add_argument("--dtype", dest="dtypes", action="append", default=[], metavar="DTYPE",
                   help="a torch dtype name (repeatable; default float32)")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                   help=f"samples per op and variant (default {DEFAULT_SAMPLES})")
    p.add_argument("--variant", dest="variants", action="append", default=[], choices=VARIANTS,
                   help="run only these variants (repeatable; default all)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: one per core)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds one variant of one op may run before it counts as a hang (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--expected", type=Path, default=EXPECTED, help="the expected-failure list")
    p.add_argument("--write-expected", type=Path, metavar="FILE",
                   help="write the list this run calls for to FILE: kept entries and, for new failures, "
                        "entries with reason UNEXPLAINED for you to explain")
    p.add_argument("--strict", action="store_true", help="a listed failure that passes now fails the run")
    p.add_argument("--report", type=Path, help="write the results and the summary as JSON to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        from tests.conformance import worker

        worker.main()
        return 0
    try:
        return _supervise(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (expectations.ListError, WorkerFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _supervise(args) -> int:
    dtypes = list(dict.fromkeys(args.dtypes or ["float32"]))
    variants = [v for v in VARIANTS if v in args.variants] or list(VARIANTS)
    if args.samples < 1:
        raise BadInput("--samples must be at least 1")
    if args.workers < 1:
        raise BadInput("--workers must be at least 1")
    if args.timeout <= 0:
        raise BadInput("--timeout must be positive")
    entries = expectations.load(args.expected)
    from importlib.metadata import version

    torch_version = version("torch")
    start = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    results, ops = run_jobs(dtypes, args.patterns, variants, args.samples, args.workers, args.timeout,
                            ROOT / "build" / "conformance", progress=lambda n: None)
    seconds = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    judgement = expectations.judge(results, entries, torch_version)
    code = judgement.exit_code(args.strict)
    head = (f"conformance of {DEVICE} against the CPU: {ops} OpInfos, dtypes {', '.join(dtypes)}, "
            f"{args.samples} samples per variant, {args.workers} workers, torch {torch_version}, {seconds:.1f} s "
            f"(workers' CPU time {cpu:.1f} s)")
    summary = summary_lines(judgement, variants, dtypes)
    failures = failure_lines(judgement)
    n_fail = len(judgement.of("fail"))
    tail = (f"{n_fail} unexpected failures in {len({v.op for v in judgement.of('fail')})} ops, "
            f"{len(judgement.of('xfail'))} expected, {len(judgement.of('fixed'))} fixed, "
            f"{len(judgement.unexplained)} unexplained entries: {'FAILED' if code else 'OK'}")
    for line in [head, *summary, *failures, tail]:
        print(line)
    if args.write_expected:
        new = expectations.rewrite(entries, judgement, torch_version)
        args.write_expected.write_text(expectations.dump(new))
        unexplained = sum(1 for e in new if not e.explained)
        print(f"wrote {len(new)} entries ({unexplained} UNEXPLAINED: give each a reason) to {args.write_expected}")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({
            "exit_code": code, "seconds": round(seconds, 1), "worker_cpu_seconds": round(cpu, 1), "ops": ops, "dtypes": dtypes, "variants": variants,
            "samples": args.samples, "workers": args.workers, "torch": torch_version,
            "head": head, "summary": summary, "failures": failures, "tail": tail,
            "counts": [{"variant": var, "dtype": dt, **c} for (var, dt), c in judgement.counts().items()],
            "results": [{"op": v.op, "dtype": v.dtype, "variant": v.variant, "status": v.status, "detail": v.detail,
                         "verdict": v.verdict, "reason": v.entry.reason if v.entry else None, "seconds": r.get("seconds")}
                        for v, r in zip(judgement.verdicts, results)],
        }, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
