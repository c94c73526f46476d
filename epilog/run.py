"""What the Slurm epilog does (its entry point, epilog/hook.py, is thin): kill the job's leftover tasks
(epilog/strays.py), remove its metrics file, write the job's health record for this node, then drain for a
hardware fault.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

from clusterctl.clock import utc
from clusterctl.epilog.strays import kill_strays
from clusterctl.errors import ClusterctlError
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import GateReport, check_node, parse_job_gpus, read_state, state_is_fresh
from clusterctl.healthd.hook_common import (
    bounded, budgeted_slurm, drain_node, hook_config, job_id, job_uid, node_name, say,
)
from clusterctl.healthd.kmsg import RecordReader, parse_gpu_event
from clusterctl.healthd.policy import judge
from clusterctl.job_metrics_file import remove_textfile
from clusterctl.records.drain_reason import DrainReason
from clusterctl.records.healthd_job_start import job_start_path, read_job_start
from clusterctl.records.healthd_state import HealthdState
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, write_job_health
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Runner, subprocess_runner
from clusterctl.slurm.nodes import NodeSlurm


def run_epilog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
               config: HealthdConfig | None = None, node_check: Callable[..., GateReport] = check_node, *,
               config_path: Path | None = None, runner: Runner = subprocess_runner,
               clock: Callable[[], float] = time.monotonic,
               kill_leftovers: Callable[[str, int | None], list[int]] | None = None) -> int:
    """Kill the job's leftover tasks; record what broke on this node during the job; drain for
    hardware faults. Always 0.

    A failing epilog drains the node in Slurm with a reason nobody can act on, so nothing
    escapes: a record that cannot be written (unwritable, planted) is logged and skipped.  The
    Slurm calls of the drain path share what is left of `hook_timeout` as the prolog's do, and come
    last.  `kill_leftovers` (job id, job's uid → pids killed) is `kill_strays` unless a test gives its own.
    """
    start = clock()
    config = hook_config("epilog", config, config_path)
    if slurm_factory is None:
        slurm_factory = budgeted_slurm(runner, start, config.hook_timeout, clock)
    with bounded("epilog", config.hook_timeout, lambda: 0):  # a stuck epilog must not drain the node by itself
        try:
            _epilog(environ, slurm_factory, config, node_check, kill_leftovers or kill_strays)
        except Exception as exc:  # noqa: BLE001 - the last line of defence of "always 0"
            say("epilog", f"job {environ.get('SLURM_JOB_ID', 'unknown')!r}: gave up: {exc.__class__.__name__}: {exc}")
    return 0


def _job_start(config: HealthdConfig, job: str, end: float) -> float:
    try:
        record = read_job_start(config.journal_dir, job)
    except RecordError as exc:
        say("epilog", f"job {job}: {exc}; looking back a day")
        record = None
    return record.start if record is not None else end - 24 * 3600  # no prolog record: look back a day


def _epilog(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
            node_check: Callable[..., GateReport], kill_leftovers: Callable[[str, int | None], list[int]]) -> None:
    job = job_id(environ)
    if job is None:
        say("epilog", f"SLURM_JOB_ID {environ.get('SLURM_JOB_ID')!r} is not a job id: nothing recorded")
        return
    # The local work first, Slurm last.  At hook_timeout the epilog ends wherever it is (bounded), and
    # a Slurm call may outlast its own timeout (a client stuck on a hung controller or mount): a time
    # reserve alone would then not save what comes after it.  Killing the leftovers is a /proc scan that
    # needs neither Slurm nor the GPUs, and a leftover may hold a GPU the next job is given: it comes
    # first.  The record comes before the drain because the supervisor reads it (a hardware verdict is
    # the evidence even when the drain cannot be made), and the job-start note is forgotten with it.
    killed = kill_leftovers(job, job_uid(environ))
    if killed:
        say("epilog", f"job {job}: killed {len(killed)} leftover task(s): {', '.join(map(str, killed))}")
    if config.job_metrics_dir is not None:
        _remove_job_metrics(config.job_metrics_dir, job)
    node = node_name(environ, config)
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    end = time.time()
    start = _job_start(config, job, end)
    findings: dict[tuple[int | None, str, int | None], HealthFinding] = {}

    def add(finding: Finding, action: Action, reason: str, source: str) -> None:
        if gpus is not None and finding.gpu is not None and finding.gpu not in gpus:
            return
        key = (finding.gpu, finding.kind, finding.xid)
        if key not in findings or findings[key].action < action:
            findings[key] = HealthFinding(kind=finding.kind, action=action, reason=reason, source=source,
                                          at=utc(finding.at), xid=finding.xid, gpu=finding.gpu, uuid=finding.uuid,
                                          detail=finding.detail)

    state, unusable = read_state(config)
    if unusable:
        say("epilog", f"job {job}: {unusable}")
    if state is not None:
        for gpu in state.gpus:
            for f in gpu.findings:
                # What the last check still sees holds now; an event counts if it happened during the job.
                if (f.current or start - 1 <= f.at_ts <= end) and f.action > Action.IGNORE:
                    finding = Finding(f.kind, f.source, f.at_ts if not f.current else end, gpu=gpu.index,
                                      uuid=gpu.uuid, xid=f.xid, detail=f.detail)
                    add(finding, f.action, f.reason, "healthd")
    identities = _gpu_addresses(config, state)
    if not identities:
        say("epilog", f"job {job}: this node's GPU addresses are unknown: the kernel log is not consulted")
    for finding in _kernel_findings(config, start - 1, end, identities):
        verdict = judge(finding, (), config.policy)
        if verdict.action > Action.IGNORE:
            add(finding, verdict.action, verdict.reason, "kernel log")
    # What is still wrong now: from healthd when it is alive (cheap), else NVML directly.
    for problem in node_check(config, gpus, direct=not state_is_fresh(state, config, end)).problems:
        add(Finding(problem.finding.kind, "epilog", end, gpu=problem.finding.gpu, uuid=problem.finding.uuid,
                    xid=problem.finding.xid, detail=problem.finding.detail),
            problem.verdict.action, problem.verdict.reason, "epilog check")
    ordered = tuple(sorted(findings.values(), key=lambda f: (f.at or "", f.gpu if f.gpu is not None else -1)))
    record = JobHealthRecord(job_id=job, node=node, window_start=utc(start), window_end=utc(end),
                             written_at=utc(time.time()), gpus=tuple(gpus) if gpus is not None else None,
                             findings=ordered, exit_code=environ.get("SLURM_JOB_EXIT_CODE"))
    try:
        path = write_job_health(config.job_records_dir, record)
        say("epilog", f"job {job}: {record.verdict.label}, {len(ordered)} finding(s) → {path}")
    except (OSError, ClusterctlError) as exc:  # the drain below still happens
        say("epilog", f"job {job}: {record.verdict.label}, {len(ordered)} finding(s); record NOT written: {exc}")
    job_start_path(config.journal_dir, job).unlink(missing_ok=True)
    hardware = record.worst_finding()
    if record.hardware_fault and hardware is not None:
        reason = DrainReason(kind=hardware.kind, action=hardware.action, at=utc(end), xid=hardware.xid,
                             gpu=hardware.gpu, uuid=hardware.uuid)
        say("epilog", drain_node(config, node, reason, slurm_factory).text)


def _gpu_addresses(config: HealthdConfig, state: HealthdState | None) -> dict[str, int]:
    """This node's GPUs by PCI address (healthd's state, else NVML directly): whose kernel lines count."""
    if state is not None and any(gpu.pci_bus for gpu in state.gpus):
        return {gpu.pci_bus: gpu.index for gpu in state.gpus if gpu.pci_bus}
    try:
        from clusterctl.healthd.nvml import Nvml, NvmlError, NvmlHang, TimedCalls

        nvml = Nvml(TimedCalls(2.0, max_abandoned=1))
        try:
            nvml.init()
            return {identity.pci_bus: identity.index for identity in nvml.discover()}
        except (NvmlError, NvmlHang):
            return {}
    except ImportError:  # pragma: no cover - a broken install
        return {}


def _kernel_findings(config: HealthdConfig, start: float, end: float, identities: dict[str, int]) -> list[Finding]:
    """Xids the driver logged about this node's GPUs (`identities`: PCI address → index) during [start, end]
    (its records carry microseconds since boot)."""
    import psutil

    boot = psutil.boot_time()
    try:
        reader = RecordReader(config.kmsg)
    except OSError:
        return []
    try:
        records = reader.available()
    finally:
        reader.close()
    found = []
    for record in records:
        at = boot + record.usec / 1e6
        event = parse_gpu_event(record, identities)
        if event is not None and start <= at <= end:
            found.append(Finding("xid", "kmsg", at, gpu=identities.get(event.pci_bus), xid=event.xid,
                                 value=event.pci_bus, detail=event.message[:200]))
    return found



def _remove_job_metrics(directory: Path, job: str) -> None:
    """Remove the job's metrics file from node_exporter's textfile directory (`job_metrics_dir`), which
    its agent left if it was killed hard (clusterctl/job_metrics_file.py); said only when there was one.

    Root removes by a name built from slurmd's job id, relative to the admin's directory opened without
    following a symlink there, and unlink never follows one: a link a user planted at that name is itself
    removed, nothing it points to.  A directory others may write (the jobs write there) is no hazard
    for that, so it is not refused."""
    try:
        removed = remove_textfile(directory, job, follow_symlinks=False)
    except OSError as exc:
        hint = ": name the real directory, not a symlink to it" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else ""
        say("epilog", f"job {job}: cannot remove its metrics file from job_metrics_dir {directory} "
                       f"({exc.strerror}){hint}")
        return
    if removed:
        say("epilog", f"job {job}: removed {', '.join(removed)} from {directory} (its agent did not)")
