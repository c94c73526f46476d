"""What the Slurm prolog does (its entry point, prolog/hook.py, is thin): check the job's GPUs (healthd's gate),
run the pre-flight diagnostic, note the job's start, refuse the job only when the drain door took the node out
of service; then give the job its metrics file and reclaim stale checkpoint tiers (prolog/tier_reclaim.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterctl.clock import utc
from clusterctl.errors import ClusterctlError
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.diagnostic_runner import DiagnosticDoor, diagnostics_in_force, run_diagnostic
from clusterctl.healthd.engine import gate_verdict
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.gate import GateReport, Problem, check_node, parse_job_gpus
from clusterctl.healthd.hook_common import (
    HOOK_RESERVE, bounded, budgeted_slurm, drain_node, hook_config, job_id, job_uid, node_name, problem_reason, say,
)
from clusterctl.healthd.node_tiers import LocalTiers, TierDoor
from clusterctl.job_metrics_file import claim_textfile, textfile_name
from clusterctl.prolog.tier_reclaim import reclaim_stale_tiers
from clusterctl.records.healthd_diagnostic import append_diagnostic
from clusterctl.records.healthd_job_start import JobStart, write_job_start
from clusterctl.records.healthd_node_record import NodeRecordEntry, append_node_record
from clusterctl.slurm.commands import Runner, subprocess_runner
from clusterctl.slurm.nodes import NodeSlurm


@dataclass
class _Refusal:
    """Whether the prolog's drain door left the node out of service: the one case it may exit 1."""

    node_drained: bool = False

    def exit_code(self) -> int:
        return 1 if self.node_drained else 0


def run_prolog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
               config: HealthdConfig | None = None, node_check: Callable[..., GateReport] = check_node, *,
               config_path: Path | None = None, runner: Runner = subprocess_runner,
               clock: Callable[[], float] = time.monotonic, tiers: TierDoor | None = None,
               diagnostic_door: DiagnosticDoor = run_diagnostic) -> int:
    """0 lets the job start; 1 refuses it (Slurm drains the node and requeues the job).

    A job is refused only when the node is (now) drained by the drain door: Slurm drains a node
    whose prolog fails, so refusing while the breaker holds the drain back, while Slurm cannot be
    asked, at the hook's own deadline, on a config it cannot read or on a bug would be a drain
    around the breaker (on every node at once, for a config).  The job then starts and the reason
    is logged.  The Slurm calls of the drain path (up to four: the release, the node, the partition's
    share, the drain) share what is left of `hook_timeout` (`runner`'s timeouts are cut to it), so
    they end before the deadline.

    On a node with a `preflight` diagnostic ([diagnostics], or `dcgmi diag -r 1` where DCGM is installed),
    a node the gate finds clean runs it (through `diagnostic_door`) within PREFLIGHT_SHARE of the budget;
    one that fails refuses the job as any other blocking problem does (`preflight`).

    A job let in then gets the node's memory and disk back from checkpoint tiers nobody resumes from
    (`reclaim_stale_tiers`, through `tiers`: the node's own tier bases unless a test gives its own door).
    """
    start = clock()
    config = hook_config("prolog", config, config_path)
    refusal = _Refusal()
    if slurm_factory is None:
        slurm_factory = budgeted_slurm(runner, start, config.hook_timeout, clock)
    with bounded("prolog", config.hook_timeout, refusal.exit_code):
        try:
            preflight = _Preflight(diagnostic_door, start + config.hook_timeout * PREFLIGHT_SHARE, clock)
            code = _prolog(environ, slurm_factory, config, node_check, refusal, preflight)
        except Exception as exc:  # noqa: BLE001 - a bug must not drain the node around the breaker
            say("prolog", f"job {environ.get('SLURM_JOB_ID', 'unknown')!r}: gave up: "
                           f"{exc.__class__.__name__}: {exc}; exit {refusal.exit_code()}")
            return refusal.exit_code()
        if code == 0 and config.job_metrics_dir is not None:
            _claim_job_metrics(environ, config.job_metrics_dir)
        if code == 0 and config.tier_bases:
            reclaim_stale_tiers(environ, config, tiers or LocalTiers(config.tier_bases),
                                deadline=start + config.hook_timeout * (1 - HOOK_RESERVE), clock=clock)
        return code


def _prolog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
            node_check: Callable[..., GateReport], refusal: _Refusal, preflight_run: _Preflight | None = None) -> int:
    job = job_id(environ) or "unknown"
    node = node_name(environ, config)
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    report = node_check(config, gpus)
    # GPUs NVML cannot judge here cannot pass a diagnostic either: that is the same on every node at once.
    if report.ok and preflight_run is not None and report.gpus_unchecked is None:
        failed = preflight(config, job, preflight_run.door, preflight_run.deadline - preflight_run.clock())
        if failed is not None:
            report.problems.append(failed)
    for note in report.notes:
        say("prolog", f"job {job}: {note}")
    if report.gpus_unchecked is not None:
        # NVML that cannot be used is the same on every node at once (a driver update, a missing library):
        # refusing for it would drain them all, so the job starts, said, and `healthd check` exits 5.
        say("prolog", f"job {job}: GPUs not checked ({report.gpus_unchecked}): let in")
    if job != "unknown":
        # The epilog judges findings within the job's window, which starts now; healthd attributes
        # an Xid on one of these GPUs to this job (and its user).
        try:
            write_job_start(config.journal_dir, JobStart(job, time.time(), tuple(gpus) if gpus is not None else None,
                                                         job_uid(environ)))
        except OSError as exc:
            say("prolog", f"job {job}: start not noted in {config.journal_dir}: {exc}")
    if report.ok:
        return 0
    for problem in report.problems:
        say("prolog", f"job {job} refused on {node}: {problem.describe()}")
    outcome = drain_node(config, node, problem_reason(report.problems[0]), slurm_factory)
    refusal.node_drained = outcome.out_of_service
    say("prolog", outcome.text)
    try:
        append_node_record(config.journal_dir, NodeRecordEntry(utc(time.time()), "prolog", job, node,
                                                               tuple(p.describe() for p in report.problems),
                                                               outcome.text))
    except OSError as exc:
        say("prolog", f"refusal not recorded in {config.journal_dir}: {exc}")
    if not outcome.out_of_service:
        say("prolog", f"job {job} let in after all: refusing it would drain {node} ({outcome.text})")
        return 0
    return 1


PREFLIGHT_SHARE = 0.5
"""The prolog's pre-flight diagnostic ends by this share of `hook_timeout` (counted from the prolog's start):
what is left is room for the drain door's Slurm calls (they end by 1 - HOOK_RESERVE) and the notes."""
MIN_PREFLIGHT_S = 1.0
"""Less time than this left for the pre-flight: it is skipped (said), not started to be cut short."""


@dataclass(frozen=True)
class _Preflight:
    """How the prolog runs its pre-flight diagnostic: the door, the deadline (on `clock`) it must end by."""

    door: DiagnosticDoor
    deadline: float
    clock: Callable[[], float]


def preflight(config: HealthdConfig, job: str, door: DiagnosticDoor, seconds_left: float) -> Problem | None:
    """Run the `preflight` diagnostic if one is in force and `seconds_left` allows; a Problem when it failed.

    Only a run that said "fail" refuses: one that could not start, whose output could not be read, or that
    ran out of time (its own timeout, or the prolog's budget) lets the job in, said in slurmd's log: a
    missing DCGM host engine, or a budget too small for the level, is the same on every node at once.
    A result other than a pass is journaled (diagnostics.jsonl; passes are not: one per job start)."""
    spec = diagnostics_in_force(config).preflight
    if spec is None:
        return None
    if seconds_left < MIN_PREFLIGHT_S:
        say("prolog", f"job {job}: pre-flight {spec.name} skipped: {max(seconds_left, 0):.1f} s left of the "
                       f"prolog's budget (hook_timeout {config.hook_timeout:g} s)")
        return None
    result = door(spec, "preflight", seconds_left)
    if result.outcome != "pass":
        try:
            append_diagnostic(config.journal_dir, result)
        except OSError as exc:
            say("prolog", f"job {job}: pre-flight result not journaled in {config.journal_dir}: {exc}")
    if result.outcome == "fail":
        finding = Finding("diagnostic-failed", "prolog", result.at, value=spec.name,
                          detail=f"{result.describe()}; output: {result.excerpt}" if result.excerpt
                          else result.describe())
        return Problem(finding, gate_verdict(finding, config.policy))
    if result.outcome != "pass":
        say("prolog", f"job {job}: pre-flight {result.describe()}: let in (says nothing about this node)")
    return None



def _claim_job_metrics(environ: Mapping[str, str], directory: Path) -> None:
    """Give the job's metrics file name in `job_metrics_dir` to the job's user before the job starts
    (clusterctl/job_metrics_file.py, `claim_textfile`): a file another user created there first would
    otherwise export forged figures under the job's id.  Said when something was replaced; never fails
    the prolog."""
    job, uid = job_id(environ), job_uid(environ)
    gid = environ.get("SLURM_JOB_GID", "")
    if job is None or uid is None:
        return
    try:
        replaced = claim_textfile(directory, job, uid, int(gid) if gid.isascii() and gid.isdigit() else uid)
    except (OSError, ClusterctlError) as exc:
        say("prolog", f"job {job}: its metrics file in job_metrics_dir {directory} not made ready: "
                       f"{getattr(exc, 'strerror', None) or exc}")
        return
    if replaced is not None:
        say("prolog", f"job {job}: {directory}/{textfile_name(job)} was {replaced}, not of the job's uid {uid} "
                       "(made first by another user): replaced with the job's own, empty")
