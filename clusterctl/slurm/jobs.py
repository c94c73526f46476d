"""Parsers for Slurm's job reports (`squeue --json`, `sacct --json`, `sbatch --parsable`), every release.

Pure functions on text; the real outputs of each Slurm release recorded on the testbed
(tests/data/slurm/<release>/) are their unit-test data.  Each output names its own format in
`meta` (22.05: `meta.plugin.type` "openapi/v0.0.38"; 23.02: `meta.plugins.data_parser`
"data_parser/v0.0.39", with `plugins` plural; 23.11 on: `meta.plugin.data_parser` "data_parser/v0.0.4x");
the family decides how each field reads:

| field | v0.0.38 (22.05) | v0.0.39 (23.02) | v0.0.40+ (23.11 → 26.05) |
|---|---|---|---|
| squeue `job_state` / sacct `state.current` | "FAILED" | "FAILED" | ["FAILED", flags…] |
| squeue `exit_code` | wait status (768 = exit 3) | wait status: int to 23.02.3, {set, infinite, number} from 23.02.4 | {status, return_code{set,number}, signal{id{set,number}}} |
| squeue times | int | int | {set, infinite, number} |
| sacct `exit_code` | {status, return_code} | {status, return_code}, signal{signal_id, name} when signalled | {status, return_code{set,number}, signal{id{set,number}}} |
| sacct step id | `step.id` "batch" / 0 | `step.id` {"job_id": N, "step_id": "batch"} | `step.id` "N.batch" |

A single string state may be a flag standing for the whole state (22.05's and 23.02's
`job_state_string`: "COMPLETING", "REQUEUED"...).  Whatever the family, an output the parser
does not understand is a SlurmVersionError naming the release, the command and the field, never a
job silently read as "no jobs", "not terminal" or exit 0.

Relied-on behaviour: 22.05's `squeue --json` ignores filters and lists every job slurmctld
holds (finished ones for MinJobAge); 23.02's honours one `-j ID` but not several, nor the default
state filter; from 24.05.1 filters are honoured and finished jobs need `-t all`.  sacct's JSON
exit code of a failed job reads SUCCESS/0 on 22.05/23.02 (23.02.8 recorded; its v0.0.39 dumper
writes SUCCESS/0 for every job that exited, whatever the code), so it is reported as unknown
there.  Accounting can lag the controller by seconds.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.names import is_job_id
from clusterctl.slurm.version import SlurmVersion, SlurmVersionError

TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                             "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})

UNFINISHED_FLAGS = frozenset({"COMPLETING", "STAGE_OUT"})
"""State flags that mean Slurm is still finishing a job whose base state is already final."""

FAMILY_38, FAMILY_39, FAMILY_40 = "v0.0.38", "v0.0.39", "v0.0.40+"
"""The `--json` output families (see clusterctl.slurm.version.SlurmVersion.json_family)."""

_PLUGIN_VERSION = re.compile(r"v0\.0\.(\d+)$")


@dataclass(frozen=True)
class StepReport:
    """One step of a job (from accounting); `step` is the step's own id: "batch", "extern", "0"."""

    step: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None
    nodes: tuple[str, ...]
    state_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobReport:
    """What Slurm says about one job.

    `state` is the base state ("FAILED"), `state_flags` the flags Slurm listed after it
    (e.g. "REQUEUED"); `exit_code`/`signal` are None when Slurm did not say (or, for 22.05's
    and 23.02's accounting, cannot be trusted); times are epoch seconds, 0 when unset.
    """

    job_id: str
    name: str
    state: str
    reason: str
    nodes: str
    exit_code: int | None
    signal: int | None
    submit_time: float
    start_time: float
    end_time: float
    restarts: int = 0
    steps: tuple[StepReport, ...] = ()
    source: str = "squeue"
    comment: str = ""
    state_flags: tuple[str, ...] = ()
    user_id: int | None = None  # who owns the job (squeue): another user's job is never one of ours

    @property
    def states(self) -> tuple[str, ...]:
        """The state as Slurm lists it: base state first, then its flags."""
        return (self.state, *self.state_flags)

    @property
    def terminal(self) -> bool:
        """Slurm is done with the job (it will not run again unless resubmitted) and its epilogs have run.

        From 23.11 a job whose epilog still runs reads ["CANCELLED", "COMPLETING"] (22.05 said
        "COMPLETING"): it is not done until the flag is gone, so epilog records are there to read.
        """
        return self.state in TERMINAL_STATES and not UNFINISHED_FLAGS.intersection(self.state_flags)


class _Output:
    """One command's JSON output with the family it is in, for reading fields with clear errors."""

    def __init__(self, text: str, argv: list[str], release: SlurmVersion | None) -> None:
        self.argv = argv
        self.release = str(release) if release else None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise SlurmCommandError(argv, 0, f"output is not JSON ({str(exc)[:80]})") from None
        if not isinstance(data, dict):
            raise SlurmCommandError(argv, 0, "JSON output is not an object")
        meta = data.get("meta")
        self.release = _meta_release(meta) or self.release
        self.family = self._family(meta, release)
        jobs = data.get("jobs")
        if not isinstance(jobs, list):
            self.fail("jobs", jobs, "a list of jobs")
        self.jobs: list[Any] = jobs

    def _family(self, meta: object, release: SlurmVersion | None) -> str:
        """The family the output names (`meta.plugin`; 23.02: `meta.plugins`), else the asked release's."""
        where, plugin = "meta.plugin", None
        if isinstance(meta, dict):
            for key in ("plugin", "plugins"):
                if isinstance(meta.get(key), dict):
                    where, plugin = f"meta.{key}", meta[key]
                    break
        named = ""
        if isinstance(plugin, dict):
            named = str(plugin.get("data_parser") or plugin.get("type") or "")
        match = _PLUGIN_VERSION.search(named)
        if match:
            number = int(match[1])
            if number == 38:
                return FAMILY_38
            if number == 39:
                return FAMILY_39
            if number >= 40:
                return FAMILY_40
            self.fail(where, named, "v0.0.38 or later")
        if release is not None:
            return release.json_family
        self.fail(where, plugin, "the output's format (`data_parser` or `type`)")

    def fail(self, where: str, value: object, expected: str) -> NoReturn:
        """Raise the error naming release, command and field."""
        shown = json.dumps(value)[:80] if _jsonable(value) else repr(value)[:80]
        raise SlurmVersionError(self.argv, f"Slurm {self.release or '(release unknown)'}: `{where}` is {shown}, "
                                           f"expected {expected} ({self.family if hasattr(self, 'family') else '?'}"
                                           " output); this clusterctl cannot read it")

    # ---- field readers: each either returns the typed value or fails naming the field ----------
    def obj(self, value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, value, "an object")
        return value

    def text(self, job: dict[str, Any], key: str, where: str) -> str:
        value = job.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            self.fail(f"{where}.{key}", value, "a string")
        return value

    def number(self, value: object, where: str) -> int | None:
        """An int, or 23.02+'s {set, infinite, number} (None when unset or infinite)."""
        if isinstance(value, dict) and self.family != FAMILY_38:
            number = _as_int(value.get("number"))
            if not isinstance(value.get("set"), bool) or number is None:
                self.fail(where, value, "{set, infinite, number}")
            return number if value["set"] and not value.get("infinite") else None
        if value is None:
            return None
        found = _as_int(value)
        if found is None:
            self.fail(where, value, "an integer" + (" or {set, infinite, number}" if self.family != FAMILY_38 else ""))
        return found

    def time(self, value: object, where: str) -> float:
        found = self.number(value, where)
        return float(found) if found is not None else 0.0

    def job_id(self, job: dict[str, Any], where: str) -> str:
        value = job.get("job_id")
        number = _as_int(value)
        if number is not None and is_job_id(str(number)):
            return str(number)
        if isinstance(value, str) and is_job_id(value):  # ASCII digits: the id goes to scancel/sacct argv
            return value
        self.fail(f"{where}.job_id", value, "a job id")

    def states(self, value: object, where: str) -> tuple[str, tuple[str, ...]]:
        """(base state, flags) from "FAILED" (v0.0.38, v0.0.39) or ["FAILED", flags...] (v0.0.40+)."""
        listed = self.family == FAMILY_40
        if not listed and isinstance(value, str) and value:
            return value, ()
        if listed and isinstance(value, list) and value and all(isinstance(s, str) and s for s in value):
            return value[0], tuple(value[1:])
        self.fail(where, value, "a list of states, base state first" if listed else "a state string")

    def exit_object(self, value: object, where: str) -> tuple[int | None, int | None]:
        """sacct's (and v0.0.40+ squeue's) exit code object → (exit code, signal)."""
        if value is None:
            return None, None
        found = self.obj(value, where)
        code = self.number(found.get("return_code"), f"{where}.return_code")
        signal_field = found.get("signal")
        signal = None
        if isinstance(signal_field, dict):
            ident = signal_field.get("id", signal_field.get("signal_id"))
            signal = self.number(ident, f"{where}.signal.id")
        elif signal_field is not None:
            self.fail(f"{where}.signal", signal_field, "an object")
        return code, signal or None


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _as_int(value: object) -> int | None:
    """The integer `value` is, else None (Slurm prints integers; a whole finite float such as 1e9 is
    the same number written another way; booleans are not numbers here)."""
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _meta_release(meta: object) -> str | None:
    if not isinstance(meta, dict):
        return None
    for key in ("slurm", "Slurm"):
        inner = meta.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("release"), str) and inner["release"]:
            return str(inner["release"])
    return None


def _each_job(out: _Output, read: Callable[[dict[str, Any], str], JobReport]) -> list[JobReport]:
    return [read(out.obj(job, f"jobs[{i}]"), f"jobs[{i}]") for i, job in enumerate(out.jobs)]


def parse_squeue_json(text: str, release: SlurmVersion | None = None,
                      argv: Sequence[str] = ("squeue", "--json")) -> dict[str, JobReport]:
    """`squeue --json` → job id → report.  `release` (asked with `sbatch --version`) is used only
    when the output does not name its own format; errors name it and `argv`."""
    out = _Output(text, list(argv), release)

    def read(job: dict[str, Any], where: str) -> JobReport:
        state, flags = out.states(job.get("job_state"), f"{where}.job_state")
        exit_code = signal = None
        if state in TERMINAL_STATES:
            exit_code, signal = _squeue_exit(out, job.get("exit_code"), f"{where}.exit_code")
        restarts = out.number(job.get("restart_cnt"), f"{where}.restart_cnt") or 0
        return JobReport(out.job_id(job, where), out.text(job, "name", where), state,
                         out.text(job, "state_reason", where), out.text(job, "nodes", where), exit_code, signal,
                         out.time(job.get("submit_time"), f"{where}.submit_time"),
                         out.time(job.get("start_time"), f"{where}.start_time"),
                         out.time(job.get("end_time"), f"{where}.end_time"), restarts,
                         comment=out.text(job, "comment", where), state_flags=flags,
                         user_id=out.number(job.get("user_id"), f"{where}.user_id"))

    return {report.job_id: report for report in _each_job(out, read)}


_UNSET_UINT32 = frozenset({0xFFFFFFFE, 0xFFFFFFFF})
"""Slurm's NO_VAL and INFINITE as a uint32, which 23.02.0-23.02.3 print as plain numbers in squeue's
`exit_code` (from 23.02.4 `{"set": false, ...}`): no wait status, so no exit code known."""


def _squeue_exit(out: _Output, value: object, where: str) -> tuple[int | None, int | None]:
    """squeue's exit code → (exit code, signal): a wait status up to v0.0.39, an object after."""
    if out.family == FAMILY_40:
        return out.exit_object(value, where)
    status: int | None
    if out.family == FAMILY_39 and isinstance(value, dict):
        # 23.02.4+: the wait status inside {set, infinite, number}.
        status = _as_int(value.get("number"))
        if not isinstance(value.get("set"), bool) or not isinstance(value.get("infinite", False), bool) \
                or status is None:
            out.fail(where, value, "a wait status (an integer or {set, infinite, number})")
        if not value["set"] or value.get("infinite"):
            return None, None
    else:
        if value is None:
            return None, None
        status = _as_int(value)
        if out.family == FAMILY_39 and status in _UNSET_UINT32:
            return None, None
    if status is None or not 0 <= status < 1 << 16:
        out.fail(where, value, "a wait status" + (" (an integer or {set, infinite, number})"
                                                  if out.family == FAMILY_39 else ""))
    return (status >> 8) & 0xFF, (status & 0x7F) or None


def parse_sacct_json(text: str, release: SlurmVersion | None = None,
                     argv: Sequence[str] = ("sacct", "--json")) -> dict[str, JobReport]:
    """`sacct --json -j ...` → job id → report with its steps.

    On 22.05 and 23.02 sacct's job exit code of a failed job reads 0: it is reported as unknown
    (None) there unless the job completed; prefer squeue's while the controller holds the job.
    """
    out = _Output(text, list(argv), release)
    trusted = out.family == FAMILY_40

    def read(job: dict[str, Any], where: str) -> JobReport:
        state_field = out.obj(job.get("state"), f"{where}.state")
        state, flags = out.states(state_field.get("current"), f"{where}.state.current")
        times = out.obj(job.get("time", {}), f"{where}.time")
        exit_code, signal = out.exit_object(job.get("exit_code"), f"{where}.exit_code")
        if state not in TERMINAL_STATES or (not trusted and state != "COMPLETED"):
            exit_code = signal = None  # not ended yet, or 22.05's and 23.02's 0 for a failed job
        steps = tuple(_sacct_step(out, out.obj(step, f"{where}.steps[{i}]"), f"{where}.steps[{i}]", trusted)
                      for i, step in enumerate(_list(out, job.get("steps", []), f"{where}.steps")))
        comment = job.get("comment")
        note = out.text(comment, "job", f"{where}.comment") if isinstance(comment, dict) else out.text(
            job, "comment", where)
        reason = state_field.get("reason")
        return JobReport(out.job_id(job, where), out.text(job, "name", where), state,
                         reason if isinstance(reason, str) else "", out.text(job, "nodes", where), exit_code, signal,
                         out.time(times.get("submission"), f"{where}.time.submission"),
                         out.time(times.get("start"), f"{where}.time.start"),
                         out.time(times.get("end"), f"{where}.time.end"), 0, steps, "sacct", note, flags)

    jobs: dict[str, JobReport] = {}
    for report in _each_job(out, read):
        # A fresh cluster reuses job ids: keep the newest submission of each id.
        if report.job_id not in jobs or report.submit_time >= jobs[report.job_id].submit_time:
            jobs[report.job_id] = report
    return jobs


def _list(out: _Output, value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        out.fail(where, value, "a list")
    return value


def _step_id(out: _Output, raw: object, where: str) -> str:
    """A sacct step's own id ("batch", "extern", "0") from each family's `step.id`."""
    if out.family == FAMILY_40:
        # "12.batch", "12.0", "12.extern": the step's own id is after the job id.
        if not isinstance(raw, str) or "." not in raw:
            out.fail(where, raw, "`<job>.<step>`")
        return raw.split(".", 1)[1]
    if out.family == FAMILY_39:
        # {"job_id": 12, "step_id": "batch"}, plus "step_het_component" for a heterogeneous step (12.0+1).
        found = out.obj(raw, where)
        step_id, component = found.get("step_id"), found.get("step_het_component")
        if not isinstance(step_id, str) or not step_id:
            out.fail(f"{where}.step_id", step_id, "a step id")
        if component is None:
            return step_id
        number = _as_int(component)
        if number is None:
            out.fail(f"{where}.step_het_component", component, "an integer")
        return f"{step_id}+{number}"
    if isinstance(raw, str | int) and not isinstance(raw, bool):
        return str(raw)
    out.fail(where, raw, "a step id")


def _sacct_step(out: _Output, step: dict[str, Any], where: str, trusted: bool) -> StepReport:
    ident = out.obj(step.get("step"), f"{where}.step")
    step_id = _step_id(out, ident.get("id"), f"{where}.step.id")
    state, flags = out.states(step.get("state"), f"{where}.state")
    code, signal = out.exit_object(step.get("exit_code"), f"{where}.exit_code")
    if state not in TERMINAL_STATES or (not trusted and state != "COMPLETED"):
        code = signal = None  # 22.05's and 23.02's batch step of a job that exited 3 reads 0 too (recorded)
    nodes = step.get("nodes")
    names = _list(out, nodes.get("list", []), f"{where}.nodes.list") if isinstance(nodes, dict) else []
    name = ident.get("name")
    return StepReport(step_id, name if isinstance(name, str) else "", state, code, signal,
                      tuple(str(n) for n in names), flags)


def parse_sbatch_parsable(text: str) -> str:
    """`sbatch --parsable` prints `<job id>[;<cluster>]`."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";")[0].strip()
    if not is_job_id(job_id):
        raise SlurmCommandError(["sbatch", "--parsable"], 0, f"unexpected output {text.strip()!r}")
    return job_id


JOB_LINE_FORMAT = "%A|%T|%U|%V|%S|%e|%r|%N|%k"
"""`squeue -o` fields of one job: id, state, uid, submit/start/end time, reason, nodes, comment
(last: the only free text, it may itself contain `|`)."""

_NO_TIME = frozenset({"", "N/A", "NONE", "UNKNOWN"})
LINE_SOURCE = "squeue-line"
"""JobReport.source of a report read from job_line_argv's text: no exit code, times in local time."""


def job_line_argv(job_id: str) -> list[str]:
    """`squeue -h -t all -j ID -o JOB_LINE_FORMAT`: one job in about 100 bytes.

    A single-job read on every release, whatever the queue's length (REQUEST_JOB_INFO_SINGLE, with
    squeue's small federation and partition reads: 0.3 ms at 12,500 nodes and 50,000 jobs on 22.05,
    bench/fleet_bench.py --probe); `--json` with `-j` moves the whole queue on 22.05 and ~15 KB on 24.05.1+.
    """
    return ["squeue", "-h", "-t", "all", "-j", job_id, "-o", JOB_LINE_FORMAT]


def _line_time(text: str) -> float:
    """squeue's local `YYYY-MM-DDTHH:MM:SS` as epoch seconds; 0 when unset or not in that form
    (SLURM_TIME_FORMAT changes it): a time is context, never the state a decision rests on."""
    if text.strip().upper() in _NO_TIME:
        return 0.0
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return 0.0


def parse_job_line(text: str, job_id: str, release: SlurmVersion | None = None,
                   argv: Sequence[str] | None = None) -> JobReport | None:
    """job_line_argv's output → the job's report (None when squeue printed no line: not held).

    The exit code is not in this output (None): read it with the job's JSON report once it is
    terminal.  A line of any other shape is a SlurmVersionError naming the release and the command.
    """
    command = list(argv or job_line_argv(job_id))
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None

    def fail(what: str) -> NoReturn:
        raise SlurmVersionError(command, f"Slurm {release or '(release unknown)'}: {what}; this clusterctl "
                                         "cannot read it")

    if len(lines) != 1:
        fail(f"{len(lines)} lines for one job, expected one")
    parts = lines[0].split("|", 8)
    if len(parts) != 9:
        fail(f"the line {lines[0][:60]!r} is not {JOB_LINE_FORMAT}")
    found, state, uid, submit, start, end, reason, nodes, comment = parts
    if found.strip() != job_id:
        fail(f"the line names job {found.strip()[:20]!r}, expected {job_id}")
    state = state.strip()
    if not state.replace("_", "").isalpha() or not state.isupper():
        fail(f"the state {state[:30]!r} is not a Slurm job state")
    uid = uid.strip()
    return JobReport(job_id, "", state, reason.strip(), nodes.strip(), None, None, _line_time(submit),
                     _line_time(start), _line_time(end), source=LINE_SOURCE,
                     comment="" if comment.strip() == "(null)" else comment.rstrip("\n"),
                     user_id=int(uid) if uid.isascii() and uid.isdigit() else None)
