"""clusterctl's one door to Slurm's commands (argv lists, timeouts; the runner is injectable)."""

from __future__ import annotations

import json
import re
import subprocess
import weakref
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import Protocol
from dataclasses import dataclass

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.hostlist import compress
from clusterctl.slurm.names import job_id_problem, node_name_problem
from clusterctl.slurm.jobs import (
    JobReport, job_line_argv, parse_job_line, parse_sacct_json, parse_sbatch_parsable, parse_squeue_json,
)
from clusterctl.slurm.version import SlurmVersion, parse_version


@dataclass(frozen=True)
class Completed:
    """What a finished Slurm command returned."""

    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], Completed]
"""Runs argv with a timeout in seconds; tests pass a fake that replays recorded outputs."""


def subprocess_runner(argv: Sequence[str], timeout: float) -> Completed:
    """The real runner: no shell, captured output, a hard timeout."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(list(argv), None, f"no answer within {timeout:g} s") from None
    except FileNotFoundError:
        raise SlurmCommandError(list(argv), 127, f"{argv[0]} is not installed or not on PATH") from None
    except OSError as exc:  # E2BIG (an argv longer than the kernel takes), EACCES...: Slurm never saw it
        raise SlurmCommandError([*argv[:1], "..."], 126, f"cannot run {argv[0]}: {exc.strerror}") from None
    return Completed(proc.returncode, proc.stdout, proc.stderr)


MIN_CALL_SECONDS = 0.2
"""A call with less time than this left in its caller's budget is not made (it could not be answered)."""


def within_deadline(runner: Runner, deadline: float, clock: Callable[[], float]) -> Runner:
    """`runner` with each call's timeout cut to what is left before `deadline` (a `clock` reading).

    For a caller with a budget of its own (a Slurm hook, which slurmd kills or drains for at its
    deadline): however many calls its path makes, they fit, and a call with no time left is not
    made (SlurmCommandError, as for a controller that does not answer)."""
    def run(argv: Sequence[str], timeout: float) -> Completed:
        left = deadline - clock()
        if left < MIN_CALL_SECONDS:
            raise SlurmCommandError(list(argv), None, "not asked: the caller's time budget is spent")
        return runner(argv, min(timeout, left))
    return run


SMALL_ANSWER = 65536
"""An answer shorter than this (bytes) is read for a load error: a queue long enough to be larger has jobs."""


def _load_error(text: str) -> str | None:
    """The error of a `--json` answer that lists no jobs because the command could not load them: squeue
    (22.05) exits 0 with `"errors": [{"source": "slurm_load_jobs", ...}]` and no jobs when slurmctld does
    not answer (tests/data/slurm/unreachable.json), which must not read as an empty queue."""
    if len(text) >= SMALL_ANSWER or '"errors"' not in text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None  # the parser says what is wrong with it
    if not isinstance(document, dict) or document.get("jobs") or not isinstance(document.get("errors"), list):
        return None
    errors = [e for e in document["errors"] if isinstance(e, dict)]
    if not errors:
        return None
    return "; ".join(f"{e.get('source', 'squeue')}: {e.get('description') or e.get('error') or 'error'}"
                     for e in errors)


def run_checked(runner: Runner, argv: list[str], timeout: float) -> str:
    """Run a Slurm command; its stdout, or SlurmCommandError with Slurm's own message."""
    result = runner(argv, timeout)
    if result.returncode != 0:
        raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
    return result.stdout


# Keyed by the runner itself, weakly: an id() would be reused by the next runner once one is gone.
_RELEASES: weakref.WeakKeyDictionary[Runner, SlurmVersion] = weakref.WeakKeyDictionary()


def ask_version(runner: Runner, timeout: float) -> SlurmVersion:
    """The Slurm release the commands belong to, asked once per runner per process (`sbatch --version`)."""
    try:
        known = _RELEASES.get(runner)
    except TypeError:  # a runner that cannot be weakly referenced is asked every time
        known = None
    if known is None:
        argv = ["sbatch", "--version"]
        known = parse_version(run_checked(runner, argv, timeout), argv)
        try:
            _RELEASES[runner] = known
        except TypeError:
            pass
    return known


def checked_job_ids(argv: list[str], job_ids: Sequence[str]) -> list[str]:
    """`job_ids` if every one is a plain job id; else SlurmCommandError, before anything runs.

    Ids come back from files and Slurm's answers: `--help`, `-1` or `1,2` must never become
    scancel's or sacct's options.
    """
    for job_id in job_ids:
        problem = job_id_problem(job_id)
        if problem:
            raise SlurmCommandError([*argv, "..."], 2, f"not run: {problem}")
    return list(job_ids)


_EXIT_CODE = re.compile(r"(?:^|\s)ExitCode=(\d{1,3}):(\d{1,3})(?=\s|$)")


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """`scontrol show job ID` → (exit code, signal) from its `ExitCode=3:0`; (None, None) when absent.
    (`DerivedExitCode=` is the steps' highest, not the job's.)"""
    match = _EXIT_CODE.search(text)
    if match is None:
        return None, None
    return int(match[1]), int(match[2]) or None


class TopologySource(Protocol):
    """What a job's plan step asks of Slurm: the switch topology (`scontrol show topology`)."""

    def show_topology(self) -> str: ...


class AllocationSlurm(TopologySource, Protocol):
    """What the in-allocation agent asks of Slurm (`Slurm`, or a test's fake): the topology for each
    step's plan, and giving failed nodes back to Slurm while the job runs on."""

    def shrink_job(self, job_id: str, keep: Sequence[str]) -> None: ...


_GRANTED = re.compile(r"^salloc: Granted job allocation (\d{1,10})\s*$", re.MULTILINE)

NOT_NOW = ("Requested nodes are busy", "Immediate execution impossible", "Connection timed out")
"""salloc --immediate's refusals that only mean "not now" (src/salloc/salloc.c: ESLURM_NODES_BUSY,
ESLURM_NOT_TOP_PRIORITY, ETIMEDOUT); every other refusal is an error the caller must see."""


def allocate_now_argv(partition: str, nodes: Sequence[str], gpus_per_node: int, *, wait_seconds: int,
                      expand_job: str | None = None, minutes: int | None = None, qos: str | None = None,
                      job_name: str = "clusterctl-grow") -> list[str]:
    """The salloc that asks for exactly `nodes` in `partition`, now or not at all (`--immediate`), holding
    them with no shell and no step (`--no-shell`).

    With `expand_job` it is an expander of that running job (`--dependency=expand:JOB`: Slurm gives it the
    job's end time and whole-node setting, and wants the same partition and QOS); without, a second
    allocation of its own, exclusive, for `minutes` (what is left of the job's time: it must not outlive
    it).  Names and ids are checked before argv."""
    for name in nodes:
        problem = node_name_problem(name)
        if problem:
            raise SlurmCommandError(["salloc", "..."], None, f"refusing to pass {name!r}: {problem}")
    if not nodes:
        raise SlurmCommandError(["salloc", "..."], 2, "not run: no nodes to ask for")
    argv = ["salloc", "--no-shell", f"--immediate={max(1, wait_seconds)}", f"--partition={partition}",
            f"--nodelist={compress(list(nodes))}", f"--nodes={len(nodes)}", f"--gres=gpu:{gpus_per_node}",
            f"--job-name={job_name}"]
    if qos:
        argv.append(f"--qos={qos}")
    if expand_job is not None:
        argv.append(f"--dependency=expand:{checked_job_ids(['salloc'], [expand_job])[0]}")
    else:
        if minutes is None or minutes < 1:
            raise SlurmCommandError(["salloc", "..."], 2, "not run: a second allocation needs a time limit of "
                                                          "at least a minute (what is left of the job's)")
        argv += ["--exclusive", f"--time={minutes}"]
    return argv


def parse_granted(argv: list[str], result: Completed) -> str | None:
    """The job id salloc was granted (`salloc: Granted job allocation 123` on stderr); None when it was
    refused only because the nodes cannot be had now; SlurmCommandError for any other refusal."""
    granted = _GRANTED.search(result.stderr) or _GRANTED.search(result.stdout)
    if result.returncode == 0 and granted:
        return granted[1]
    text = result.stderr or result.stdout
    if result.returncode != 0 and "Unable to allocate resources:" in text and any(m in text for m in NOT_NOW):
        return None
    raise SlurmCommandError(argv, result.returncode, text or "salloc said nothing of a granted allocation")


class GrowSlurm(Protocol):
    """What a grow asks of Slurm (`Slurm`, or a test's fake): the site settings that choose the route, the
    nodes asked for now or not at all, an expander merged into the job, a second allocation given back."""

    def config_value(self, key: str) -> str | None: ...

    def allocate_now(self, argv: list[str]) -> str | None: ...

    def merge_into_job(self, expander_job_id: str) -> None: ...

    def cancel(self, job_ids: list[str]) -> None: ...


class Slurm:
    """The Slurm commands clusterctl uses, each returning parsed data."""

    def __init__(self, runner: Runner = subprocess_runner, timeout: float = 30.0) -> None:
        self.runner, self.timeout = runner, timeout

    def _run(self, argv: list[str]) -> str:
        return run_checked(self.runner, argv, self.timeout)

    def show_topology(self) -> str:
        """`scontrol show topology` as text (parse with clusterctl.slurm.topology).

        SlurmCommandError also when it prints nothing but an error: scontrol (22.05) exits 0 with
        `slurm_load_topo error: Unable to contact slurm controller` when slurmctld does not answer, which
        must not read as a cluster without a topology (tests/data/slurm/unreachable.json)."""
        argv = ["scontrol", "show", "topology"]
        result = self.runner(argv, self.timeout)
        if result.returncode != 0 or (not result.stdout.strip() and " error: " in f" {result.stderr}"):
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return result.stdout

    def idle_nodes(self, partition: str | None = None) -> list[str]:
        """Nodes whose state is exactly `idle` (`sinfo -t idle` also lists drained and idle* nodes)."""
        argv = ["sinfo", "-h", "-N", "-o", "%N|%T"]
        if partition:
            argv += ["-p", partition]
        nodes = []
        for line in self._run(argv).splitlines():
            name, _, state = line.partition("|")
            if state.strip() == "idle" and name not in nodes:
                nodes.append(name.strip())
        return nodes

    def version(self) -> str:
        """`sbatch --version`, e.g. `slurm-wlm 22.05.8`."""
        return self._run(["sbatch", "--version"]).strip()

    def release(self) -> SlurmVersion:
        """The Slurm release, asked once per process (see ask_version)."""
        return ask_version(self.runner, self.timeout)

    def config_value(self, key: str) -> str | None:
        """One value of `scontrol show config` (e.g. TopologyPlugin)."""
        for line in self._run(["scontrol", "show", "config"]).splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == key:
                return value.strip()
        return None

    def sbatch(self, argv: list[str]) -> str:
        """Submit; the job id.  A refusal raises SlurmCommandError with sbatch's own message."""
        return parse_sbatch_parsable(self._run(argv))

    def queue_argv(self, job_ids: Sequence[str] = ()) -> list[str]:
        """The one squeue call that shows the given jobs (every job when none), finished ones included.

        From 24.05.1 `squeue --json` honours filters and hides finished jobs unless `-t all`;
        before, it ignores every filter and lists all jobs slurmctld holds (so: one plain call).
        """
        checked_job_ids(["squeue", "--json", "-j"], job_ids)
        if not self.release().squeue_json_filters:
            return ["squeue", "--json"]
        return ["squeue", "--json", "-t", "all", *(["-j", ",".join(job_ids)] if job_ids else [])]

    def queue_json(self, job_ids: Sequence[str] = ()) -> str:
        """`squeue --json` as queue_argv asks it (parse with parse_queue); a single job id the
        controller no longer holds (past MinJobAge) gives an empty job list, not an error."""
        argv = self.queue_argv(job_ids)
        result = self.runner(argv, self.timeout)
        if result.returncode != 0:
            if len(job_ids) == 1 and "Invalid job id specified" in result.stderr:
                return '{"jobs": [], "meta": {}}'
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        failed = _load_error(result.stdout)
        if failed is not None:
            if len(job_ids) == 1 and "Invalid job id" in failed:
                return '{"jobs": [], "meta": {}}'
            raise SlurmCommandError(argv, 0, failed)
        return result.stdout

    def parse_queue(self, text: str, job_ids: Sequence[str] = ()) -> dict[str, JobReport]:
        """queue_json's text → job id → report (only the given jobs when some are named)."""
        jobs = parse_squeue_json(text, self.release(), self.queue_argv(job_ids))
        return {k: v for k, v in jobs.items() if k in job_ids} if job_ids else jobs

    def queue(self, job_ids: Sequence[str] = ()) -> dict[str, JobReport]:
        """The controller's view of the given jobs (every job when none), finished ones included
        while it holds them (MinJobAge): works without accounting."""
        return self.parse_queue(self.queue_json(job_ids), job_ids)

    def job(self, job_id: str) -> JobReport | None:
        """One job as the controller holds it, finished or not; None when it holds it no more (past
        MinJobAge).  One single-job RPC of ~100 bytes on every release, whatever the queue's length;
        no exit code (job_exit adds it once the job is terminal)."""
        argv = job_line_argv(checked_job_ids(["squeue", "-j"], [job_id])[0])
        result = self.runner(argv, self.timeout)
        if result.returncode != 0:
            if "Invalid job id specified" in result.stderr:
                return None
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return parse_job_line(result.stdout, job_id, self.release(), argv)

    def job_exit(self, report: JobReport) -> JobReport:
        """`report` with the job's exit code and signal, asked once when it is terminal: the job's
        own `squeue --json -t all -j ID` from 24.05.1, `scontrol show job ID` before (22.05's
        `squeue --json` would move the whole queue).  Unchanged when Slurm no longer says."""
        if self.release().squeue_json_filters:
            return self.queue([report.job_id]).get(report.job_id, report)
        argv = ["scontrol", "show", "job", *checked_job_ids(["scontrol", "show", "job"], [report.job_id])]
        result = self.runner(argv, self.timeout)
        if result.returncode != 0:
            if "Invalid job id specified" in result.stderr:
                return report
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        code, signal = parse_exit_code(result.stdout)
        return replace(report, exit_code=code, signal=signal) if code is not None else report

    def accounting(self, job_ids: list[str]) -> dict[str, JobReport]:
        """Accounting records (with steps) of the given jobs, in one call; {} (unknown) when the
        cluster has no accounting storage."""
        if not job_ids:
            return {}
        argv = ["sacct", "--json", "-j", ",".join(checked_job_ids(["sacct", "--json", "-j"], job_ids))]
        result = self.runner(argv, self.timeout)
        if result.returncode != 0:
            if "accounting storage is disabled" in (result.stderr + result.stdout).lower():
                return {}
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return parse_sacct_json(result.stdout, self.release(), argv)

    def nodes_json(self) -> str:
        """Every node with its own reason: `scontrol show node --json` from 23.02, `sinfo --json` on
        22.05 (parse either with clusterctl.slurm.nodes.parse_nodes_json).  Not `sinfo --json` on
        23.02+: it groups nodes by state under the first node's reason."""
        argv = ["scontrol", "show", "node", "--json"] if self.release().scontrol_node_json else ["sinfo", "--json"]
        return self._run(argv)

    def shrink_job(self, job_id: str, keep: Sequence[str]) -> None:
        """Give every node of running job `job_id` but `keep` back to Slurm (`scontrol update JobId=...
        NodeList=...`: a running job's allocation may only shrink).  Names are checked before argv."""
        checked_job_ids(["scontrol"], [job_id])
        for name in keep:
            problem = node_name_problem(name)
            if problem:
                raise SlurmCommandError(["scontrol", "update"], None, f"refusing to pass {name!r}: {problem}")
        self._run(["scontrol", "update", f"JobId={job_id}", f"NodeList={compress(list(keep))}"])

    def allocate_now(self, argv: list[str]) -> str | None:
        """Run an allocate_now_argv salloc; the granted job id, or None when the nodes cannot be had now.
        The timeout covers salloc's own `--immediate` wait."""
        wait = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--immediate=")), 0)
        return parse_granted(argv, self.runner(argv, self.timeout + wait))

    def merge_into_job(self, expander_job_id: str) -> None:
        """Move every node of running expander job `expander_job_id` (salloc'd with `--dependency=expand:JOB`)
        into JOB, ending the expander: `scontrol update JobId=EXPANDER NumNodes=0`.  Slurm refuses while the
        expander has a step (`Job step already exists`, e.g. the extern step of PrologFlags=Contain)."""
        checked_job_ids(["scontrol"], [expander_job_id])
        self._run(["scontrol", "update", f"JobId={expander_job_id}", "NumNodes=0"])

    def job_steps(self, job_id: str, name: str | None = None) -> list[str]:
        """The numbered steps of running job `job_id` (`12.0`, `12.3`; not `batch`, `extern` or
        `interactive`), only those named `name` when given: one `squeue -s` for that job."""
        checked_job_ids(["squeue", "-s", "-j"], [job_id])
        out = self._run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
        steps = []
        for line in out.splitlines():
            step_id, _, step_name = line.strip().partition(" ")
            job, dot, step = step_id.partition(".")
            if job == job_id and dot and step.isdigit() and step.isascii() and len(step) <= 10 and (
                    name is None or step_name.strip() == name):
                steps.append(step_id)
        return steps

    def cancel_steps(self, step_ids: Sequence[str], signal: str | None = None) -> None:
        """scancel the given steps (`JOB.STEP`, each part checked before argv); with `signal` (e.g.
        "KILL") send their tasks that signal at once instead of Slurm's SIGTERM, KillWait, SIGKILL."""
        for step_id in step_ids:
            job, _, step = step_id.partition(".")
            checked_job_ids(["scancel"], [job])
            if not (step.isdigit() and step.isascii()):
                raise SlurmCommandError(["scancel", "..."], 2, f"not run: {step_id!r} is not a step id JOB.STEP")
        if signal is not None and not (signal.isalpha() and signal.isupper()):
            raise SlurmCommandError(["scancel", "..."], 2, f"not run: {signal!r} is not a signal name")
        if step_ids:
            self._run(["scancel", *([f"--signal={signal}"] if signal else []), *step_ids])

    def cancel(self, job_ids: list[str]) -> None:
        """scancel the given jobs."""
        if job_ids:
            self._run(["scancel", *checked_job_ids(["scancel"], job_ids)])
