"""`backendgen profile`: run a user's script on the backend and rank what ran on the CPU fallback.

The script runs in a child process of the same Python, started as a user would start it (autoload
on, the caller's working directory, the script's directory first on sys.path, its own arguments,
stdin/stdout/stderr inherited). A small runner (`backendgen.programs.profile_runner`) imports torch,
resets the backend's fallback counters, runs the script with `runpy`, and writes the counters
(`torch.<device>.fallback_stats()`: calls and seconds per operator) to a JSON file when the
interpreter exits: after the script returns, raises or calls sys.exit (and before an os._exit).
Nothing is read from the script's output.

`analyze` maps each operator the dispatcher named to the overload `backendgen add-op` would
register for it (`kernelgen.plan_kernel`), merging operators one kernel makes native (`mse_loss` and
`mse_loss.out`), and gives the reason where add-op cannot help. Nothing here imports torch.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from backendgen.kinds import kernelgen
from backendgen.plumbing.environment import subprocess_env
from backendgen.plumbing.errors import EnvironmentProblem, ProjectError, UserError
from backendgen.project.on_disk import Project
from backendgen.torchdb.opdb import OpDB, load_opdb


@dataclass
class OpTime:
    op: str  # the dispatcher's name, "aten::addcmul.out"
    calls: int
    seconds: float | None  # None: the backend counts calls only


@dataclass
class ProfileEntry:
    """One line of the profile: the fallback operators one add-op argument makes native (or one
    operator add-op cannot do, with the reason)."""

    ops: list[OpTime]
    target: str | None  # the argument of `backendgen add-op`
    reason: str | None = None  # why add-op cannot make it native

    @property
    def calls(self) -> int:
        return sum(o.calls for o in self.ops)

    @property
    def seconds(self) -> float | None:
        if any(o.seconds is None for o in self.ops):
            return None
        return sum(o.seconds for o in self.ops)

    @property
    def names(self) -> list[str]:
        return [o.op for o in self.ops]


def run(script: Path, args: list[str], device: str, *, stdout_to_stderr: bool = False) -> tuple[int, dict | None]:
    """Run `script` with `args` under the runner; return its exit status and what the runner wrote
    (None when the process died before writing it)."""
    env = subprocess_env(autoload="1")  # the backend loads with `import torch`, as for a user
    with tempfile.TemporaryDirectory(prefix="backendgen-profile-") as tmp:
        result = Path(tmp) / "profile.json"
        cmd = [sys.executable, "-m", "backendgen.programs.profile_runner", str(result), device, str(script), *args]
        stdout = sys.stderr.fileno() if stdout_to_stderr else None
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # Ctrl-C reached the script too: wait for it to write what ran
        data = None
        if result.is_file():
            try:
                data = json.loads(result.read_text())
            except ValueError:
                data = None
    return status, data


def status_text(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def analyze(stats: dict[str, list], db: OpDB, project: Project) -> list[ProfileEntry]:
    """Group the fallback's operators by the add-op argument that makes them native, ranked by
    time, then calls."""
    by_target: dict[str, ProfileEntry] = {}
    entries: list[ProfileEntry] = []
    for name, (calls, seconds) in stats.items():
        if not calls:
            continue
        t = OpTime(name, int(calls), None if seconds is None else float(seconds))
        target, reason = add_op_target(name, db, project)
        if target is None:
            entries.append(ProfileEntry([t], None, reason))
        elif target in by_target:
            by_target[target].ops.append(t)
        else:
            by_target[target] = entry = ProfileEntry([t], target, reason)
            entries.append(entry)
    for e in entries:
        e.ops.sort(key=lambda o: (-(o.seconds or 0.0), -o.calls, o.op))
    entries.sort(key=lambda e: (-(e.seconds or 0.0), -e.calls, e.names[0]))
    return entries


def add_op_target(name: str, db: OpDB, project: Project) -> tuple[str | None, str | None]:
    """(the overload add-op registers for `name`, None), or (None, why add-op cannot make it native);
    an operator the project already records comes back with its target and a reason to rebuild."""
    namespace, _, short = name.partition("::")
    if namespace != "aten" or not short:
        return None, "not an ATen operator (add-op writes kernels for aten:: operators)"
    try:
        plan = kernelgen.plan_kernel(db, db.resolve(name), features=project.features)
        kernelgen.check_supported(plan.target, features=project.features)
    except UserError as e:
        return None, _short_reason(name, str(e))
    target = plan.target.qualified
    if project.covering(target) is not None:
        return (
            target,
            "native in backendgen.json, but the installed build ran it on the CPU: rebuild (backendgen build)",
        )
    return target, None


def _short_reason(name: str, message: str) -> str:
    reason = message.split("; ", 1)[0]
    for prefix in (f"{name}: ", f"{name} ", f"{name.removeprefix('aten::')}: "):
        if reason.startswith(prefix):
            return reason[len(prefix) :]
    return reason


def add_op_command(targets: list[str], project_option: Path | None) -> str | None:
    """The one command that makes every target native, quoted for a POSIX shell."""
    if not targets:
        return None
    words = ["backendgen", "add-op", *targets]
    if project_option is not None:
        words += ["--project", str(project_option)]
    return " ".join(shlex.quote(w) for w in words)


@dataclass
class ProfileResult:
    root: Path  # the project
    device: str
    script: Path
    args: list[str]
    exit_status: int  # the script's (negative: killed by that signal)
    seconds: float | None  # how long the script ran (None: no profile was collected)
    entries: list[ProfileEntry] = field(default_factory=list)
    command: str | None = None  # `backendgen add-op …` for every entry add-op can make native
    notes: list[str] = field(default_factory=list)
    collected: bool = True  # False: the script died before the counters could be read

    @property
    def fallback_seconds(self) -> float | None:
        times = [e.seconds for e in self.entries]
        return None if any(t is None for t in times) else sum(times)

    @property
    def targets(self) -> list[str]:
        return [e.target for e in self.entries if e.target is not None and e.reason is None]

    def share(self, entry: ProfileEntry) -> float | None:
        """The entry's part of the script's run time."""
        if entry.seconds is None or not self.seconds:
            return None
        return entry.seconds / self.seconds

    def to_json(self) -> dict:
        return {
            "project": str(self.root),
            "device": self.device,
            "script": str(self.script),
            "args": self.args,
            "exit_status": self.exit_status,
            "collected": self.collected,
            "seconds": self.seconds,
            "fallback_seconds": self.fallback_seconds,
            "operators": [
                {
                    "add_op": e.target if e.reason is None else None,
                    "target": e.target,
                    "reason": e.reason,
                    "calls": e.calls,
                    "seconds": e.seconds,
                    "share": self.share(e),
                    "ops": [{"op": o.op, "calls": o.calls, "seconds": o.seconds} for o in e.ops],
                }
                for e in self.entries
            ],
            "command": self.command,
            "notes": self.notes,
        }


def check_installed(project: Project) -> None:
    """The project's backend must be what `import torch` loads in this Python."""
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    dist_name = project.dist_name
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"the backend {dist_name} is not installed in this Python ({sys.executable}); build it first: "
            f"backendgen build --project {shlex.quote(str(project.root))}"
        ) from None
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        info = {}
    url = urlparse(info.get("url", ""))
    if url.scheme == "file" and info.get("dir_info", {}).get("editable"):
        where = Path(unquote(url.path)).resolve()
        if where != project.root.resolve():
            raise UserError(
                f"{dist_name} is installed from {where}, not from {project.root}; profile there (--project "
                f"{shlex.quote(str(where))}), or rebuild this project: "
                f"backendgen build --project {shlex.quote(str(project.root))}"
            )


# --- the command -------------------------------------------------------------------------------


def profile(
    script: Path, args: list[str] | None = None, project_dir: Path | None = None, *, stdout_to_stderr: bool = False
):
    """Run `script` (with `args`) on the project's backend and return what ran on the CPU fallback,
    ranked, with the `backendgen add-op` argument for each operator (a `ProfileResult`).

    The script's output goes where this process's goes (`stdout_to_stderr`: its stdout to stderr,
    to keep stdout for a machine-readable report). A script that fails still gets its profile: its
    exit status is in the result."""
    project = Project.of(project_dir)
    script = Path(script)
    if not script.exists():
        raise UserError(f"no such script: {script}")
    if script.is_dir() and not (script / "__main__.py").is_file():
        raise UserError(f"{script} is a directory without __main__.py, not a script")
    check_installed(project)
    status, data = run(script, list(args or []), project.device, stdout_to_stderr=stdout_to_stderr)
    if data is not None and data.get("error") == "import":
        raise EnvironmentProblem(f"import torch failed in the script's process: {data.get('detail')}")
    if data is not None and data.get("error") == "not_loaded":
        raise ProjectError(
            f"`import torch` did not load the {project.device} backend (torch.{project.device} is missing; see the "
            f"warning above, if any); rebuild it: backendgen build --project {project.root}"
        )
    result = ProfileResult(project.root, project.device, script, list(args or []), status, None, collected=False)
    if data is None or "stats" not in data:
        detail = f": {data['detail']}" if data and data.get("detail") else ""
        result.notes.append(f"the script {status_text(status)} before its profile could be collected{detail}")
        return result
    result.collected = True
    result.seconds = data["seconds"]
    db = load_opdb()
    result.entries = analyze(data["stats"], db, project)
    result.command = add_op_command(result.targets, project.root if project_dir is not None else None)
    if db.torch_version != project.torch_version:
        result.notes.append(
            f"the project was generated for torch {project.torch_version} but torch {db.torch_version} is installed: "
            "add-op refuses until the project is upgraded (backendgen check, docs/upgrading.md)"
        )
    if any(e.seconds is None for e in result.entries):
        result.notes.append("this backend counts fallback calls but not their time (a project from an older template)")
    if status != 0:
        result.notes.append(f"the script {status_text(status)}; the profile covers what ran until then")
    return result
