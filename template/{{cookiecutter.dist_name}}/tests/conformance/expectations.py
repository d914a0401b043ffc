"""The expected-failure list of the conformance suite (expected_failures.json) and the verdicts.

Plain Python, no torch: the supervisor and the tests of this logic import it on its own.

The file:

    {"format": 1,
     "entries": [
       {"op": "linalg.eig", "variants": ["backward"], "dtypes": ["float32"], "torch": "2.13",
        "reason": "why the device differs from the CPU here, and why that is acceptable"}
     ]}

- "op": an OpInfo name as the suite prints it (`name` or `name.variant_test_name`); shell-style
  wildcards (`linalg.*`) are allowed.
- "variants": any of forward, backward, inplace, out, or ["*"] for all.
- "dtypes" (optional): torch dtype names; without it the entry applies to every dtype.
- "torch" (optional): a torch version or a list of them ("2.13" matches 2.13.x); without it the
  entry applies to every torch.
- "reason" (required): why. "UNEXPLAINED" (what --write-expected writes) is refused: the suite
  fails until every entry says why.

Verdicts, per (op, dtype, variant) result:
- pass / skip: passed or not applicable, and not listed;
- xfail: failed (mismatch, error, crash or hang) and listed;
- fixed: passed but listed: the entry is stale ("remove it"); fails the suite with --strict;
- fail: failed and not listed: fails the suite.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
VARIANTS = ("forward", "backward", "inplace", "out")
FAILING = ("mismatch", "error", "crash", "hang")
UNEXPLAINED = "UNEXPLAINED"


class ListError(Exception):
    """The expected-failure file cannot be used as it is."""


@dataclass
class Entry:
    op: str
    variants: list[str]
    reason: str
    dtypes: list[str] | None = None
    torch: list[str] | None = None

    def to_json(self) -> dict:
        d = {"op": self.op, "variants": self.variants}
        if self.dtypes:
            d["dtypes"] = self.dtypes
        if self.torch:
            d["torch"] = self.torch[0] if len(self.torch) == 1 else self.torch
        d["reason"] = self.reason
        return d

    def applies_to_torch(self, version: str) -> bool:
        return not self.torch or any(version == v or version.startswith(v + ".") or version.startswith(v + "+")
                                     for v in self.torch)

    def matches(self, op: str, variant: str, dtype: str, torch_version: str) -> bool:
        return (
            fnmatch.fnmatchcase(op, self.op)
            and ("*" in self.variants or variant in self.variants)
            and (not self.dtypes or dtype in self.dtypes)
            and self.applies_to_torch(torch_version)
        )

    @property
    def explained(self) -> bool:
        return bool(self.reason.strip()) and self.reason.strip().upper() != UNEXPLAINED


def _entry(raw, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ListError(f"{where}: an entry must be an object")
    unknown = set(raw) - {"op", "variants", "dtypes", "torch", "reason"}
    if unknown:
        raise ListError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    op, variants, reason = raw.get("op"), raw.get("variants"), raw.get("reason")
    if not isinstance(op, str) or not op:
        raise ListError(f"{where}: 'op' must be an OpInfo name")
    if isinstance(variants, str):
        variants = [variants]
    if not isinstance(variants, list) or not variants or any(v not in VARIANTS + ("*",) for v in variants):
        raise ListError(f"{where} ({op}): 'variants' must list some of {', '.join(VARIANTS)} (or '*')")
    if not isinstance(reason, str):
        raise ListError(f"{where} ({op}): every entry needs a 'reason'")
    dtypes = raw.get("dtypes")
    if isinstance(dtypes, str):
        dtypes = [dtypes]
    if dtypes is not None and (not isinstance(dtypes, list) or not all(isinstance(d, str) and d for d in dtypes)):
        raise ListError(f"{where} ({op}): 'dtypes' must be a list of dtype names")
    torch_versions = raw.get("torch")
    if isinstance(torch_versions, str):
        torch_versions = [torch_versions]
    if torch_versions is not None and (not isinstance(torch_versions, list)
                                       or not all(isinstance(v, str) and v for v in torch_versions)):
        raise ListError(f"{where} ({op}): 'torch' must be a version or a list of versions")
    return Entry(op, list(variants), reason, dtypes or None, torch_versions or None)


def load(path: Path) -> list[Entry]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    except ValueError as e:
        raise ListError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ListError(f"{path}: expected an object with \"format\": {FORMAT} and a list of \"entries\"")
    return [_entry(raw, f"{path} entry {i + 1}") for i, raw in enumerate(data["entries"])]


@dataclass
class Verdict:
    op: str
    dtype: str
    variant: str
    status: str  # pass | mismatch | error | crash | hang | skipped
    detail: str | None
    verdict: str  # pass | skip | xfail | fixed | fail
    entry: Entry | None = None


@dataclass
class Judgement:
    verdicts: list[Verdict] = field(default_factory=list)
    unexplained: list[Entry] = field(default_factory=list)

    def of(self, verdict: str) -> list[Verdict]:
        return [v for v in self.verdicts if v.verdict == verdict]

    def exit_code(self, strict: bool = False) -> int:
        bad = self.of("fail") or self.unexplained or (strict and self.of("fixed"))
        return 1 if bad else 0

    def counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """{(variant, dtype): {pass, fail, mismatch, error, crash, hang, xfail, fixed, skip}}; the
        failure kinds count unexpected failures only (they add up to `fail`)."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        for v in self.verdicts:
            c = out.setdefault((v.variant, v.dtype), dict.fromkeys(
                ("pass", "fail", "mismatch", "error", "crash", "hang", "xfail", "fixed", "skip"), 0))
            c[v.verdict] += 1
            if v.verdict == "fail":
                c[v.status] += 1
        return out


def judge(results: list[dict], entries: list[Entry], torch_version: str) -> Judgement:
    """Verdicts for the suite's results (dicts with op, dtype, variant, status, detail)."""
    j = Judgement(unexplained=[e for e in entries if not e.explained])
    for r in results:
        entry = next((e for e in entries if e.matches(r["op"], r["variant"], r["dtype"], torch_version)), None)
        status = r["status"]
        if status in FAILING:
            verdict = "xfail" if entry else "fail"
        elif status == "pass":
            verdict = "fixed" if entry else "pass"
        else:
            verdict = "skip"
        j.verdicts.append(Verdict(r["op"], r["dtype"], r["variant"], status, r.get("detail"), verdict, entry))
    return j


def rewrite(entries: list[Entry], judgement: Judgement, torch_version: str) -> list[Entry]:
    """The list as this run says it should be: entries that still match a failure keep their
    reason (variants that only passed are dropped from them, entries left with none go), entries
    this run did not exercise stay, and every failure no entry covers gets a new entry with
    reason UNEXPLAINED (one per op and set of dtypes; without dtypes when it failed on every
    dtype the op ran with)."""
    failing = judgement.of("fail") + judgement.of("xfail")
    kept = []
    for e in entries:
        matched = [v for v in judgement.verdicts if v.entry is e]
        if not matched or "*" in e.variants:
            if not matched or any(v.verdict == "xfail" for v in matched):
                kept.append(e)
            continue
        variants = [var for var in e.variants
                    if any(v.variant == var and v.verdict == "xfail" for v in matched)
                    or not any(v.variant == var for v in matched)]
        if variants:
            kept.append(Entry(e.op, variants, e.reason, e.dtypes, e.torch))
    new: dict[tuple[str, tuple[str, ...] | None], set[str]] = {}
    for v in judgement.of("fail"):
        ran = {w.dtype for w in judgement.verdicts if w.op == v.op and w.variant == v.variant and w.verdict != "skip"}
        failed = {w.dtype for w in failing if w.op == v.op and w.variant == v.variant}
        dtypes = None if failed >= ran else tuple(sorted(failed))
        new.setdefault((v.op, dtypes), set()).add(v.variant)
    for (op, dtypes), variants in sorted(new.items(), key=lambda kv: (kv[0][0], kv[0][1] or ())):
        kept.append(Entry(op, [x for x in VARIANTS if x in variants], UNEXPLAINED, list(dtypes) if dtypes else None))
    return kept


def dump(entries: list[Entry]) -> str:
    return json.dumps({"format": FORMAT, "entries": [e.to_json() for e in entries]}, indent=1) + "\n"
