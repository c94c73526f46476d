"""What the Slurm prolog, epilog and HealthCheckProgram do (their entry points are thin).

All three run as root with an empty environment, so PATH is set here, the configuration
is read from its default path, and every step is bounded by `hook_timeout`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from clusterctl.clock import utc
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.config import ConfigError, HealthdConfig, load_config
from clusterctl.healthd.engine import hook_drain
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import HOOK_PATH, GateReport, Problem, check_node, from_state, parse_job_gpus, read_state, state_is_fresh
from clusterctl.healthd.kmsg import RecordReader, parse_gpu_event
from clusterctl.healthd.policy import drain_reason, judge
from clusterctl.records.drain_reason import DrainReason
from clusterctl.records.healthd_job_start import JobStart, job_start_path, read_job_start, write_job_start
from clusterctl.records.healthd_node_record import NodeRecordEntry, append_node_record
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, write_job_health
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.nodes import SlurmNode


def _say(hook: str, message: str) -> None:
    print(f"clusterctl-{hook}: {message}", file=sys.stderr, flush=True)  # slurmd puts it in its log


def _setup(hook: str, config: HealthdConfig | None = None) -> HealthdConfig:
    os.environ.setdefault("PATH", HOOK_PATH)
    if config is not None:
        return config
    try:
        return load_config(None)
    except ConfigError as exc:
        _say(hook, f"{exc}; using defaults")
        return HealthdConfig()


@contextmanager
def _bounded(hook: str, seconds: float, on_timeout_exit: int) -> Iterator[None]:
    """Never hang: past `seconds` the hook says so and exits (SIGALRM); disarmed on the way out."""
    def expired(*_: object) -> None:
        _say(hook, f"gave up after {seconds:g} s (a hung driver or Slurm command?)")
        os._exit(on_timeout_exit)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _drain(node: str, reason: DrainReason, slurm_factory: Callable[[str], SlurmNode]) -> str:
    """Drain with an owned reason unless the node is already drained (by anyone)."""
    slurm = slurm_factory(node)
    try:
        state = slurm.state()
        text = hook_drain(state, reason)
        if text is None:
            return f"already drained ({state.reason})"
        slurm.drain(text)
        return f"drained: {text}"
    except SlurmCommandError as exc:
        return f"could not drain ({exc})"


def _problem_reason(problem: Problem) -> DrainReason:
    return drain_reason(problem.finding, problem.verdict, time.time())


def run_prolog(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode] = SlurmNode,
               config: HealthdConfig | None = None) -> int:
    """0 lets the job start; 1 refuses it (Slurm drains the node and requeues the job)."""
    config = _setup("prolog", config)
    with _bounded("prolog", config.hook_timeout, 1):
        return _prolog(environ, slurm_factory, config)


def _prolog(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode], config: HealthdConfig) -> int:
    job = environ.get("SLURM_JOB_ID", "unknown")
    node = environ.get("SLURMD_NODENAME") or config.node_name
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    report = check_node(config, gpus)
    for note in report.notes:
        _say("prolog", f"job {job}: {note}")
    # The epilog judges findings within the job's window, which starts now.
    write_job_start(config.journal_dir, JobStart(job, time.time(), tuple(gpus) if gpus is not None else None))
    if report.ok:
        return 0
    for problem in report.problems:
        _say("prolog", f"job {job} refused on {node}: {problem.describe()}")
    outcome = _drain(node, _problem_reason(report.problems[0]), slurm_factory)
    _say("prolog", outcome)
    append_node_record(config.journal_dir, NodeRecordEntry(utc(time.time()), "prolog", job, node,
                                                           tuple(p.describe() for p in report.problems), outcome))
    return 1


def _kernel_findings(config: HealthdConfig, start: float, end: float, identities: dict[str, int]) -> list[Finding]:
    """Xids the kernel logged during [start, end] (its records carry microseconds since boot)."""
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
        event = parse_gpu_event(record)
        if event is not None and start <= at <= end:
            found.append(Finding("xid", "kmsg", at, gpu=identities.get(event.pci_bus), xid=event.xid,
                                 value=event.pci_bus, detail=event.message[:200]))
    return found


def run_epilog(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode] = SlurmNode,
               config: HealthdConfig | None = None, node_check: Callable[..., GateReport] = check_node) -> int:
    """Record what broke on this node during the job; drain for hardware faults. Always 0."""
    config = _setup("epilog", config)
    with _bounded("epilog", config.hook_timeout, 0):  # a stuck epilog must not drain the node by itself
        return _epilog(environ, slurm_factory, config, node_check)


def _job_start(config: HealthdConfig, job: str, end: float) -> float:
    try:
        record = read_job_start(config.journal_dir, job)
    except RecordError as exc:
        _say("epilog", f"job {job}: {exc}; looking back a day")
        record = None
    return record.start if record is not None else end - 24 * 3600  # no prolog record: look back a day


def _epilog(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode], config: HealthdConfig,
            node_check: Callable[..., GateReport]) -> int:
    job = environ.get("SLURM_JOB_ID", "unknown")
    node = environ.get("SLURMD_NODENAME") or config.node_name
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
        _say("epilog", f"job {job}: {unusable}")
    identities: dict[str, int] = {}
    if state is not None:
        identities = {gpu.pci_bus: gpu.index for gpu in state.gpus}
        for gpu in state.gpus:
            for f in gpu.findings:
                # What the last check still sees holds now; an event counts if it happened during the job.
                if (f.current or start - 1 <= f.at_ts <= end) and f.action > Action.IGNORE:
                    finding = Finding(f.kind, f.source, f.at_ts if not f.current else end, gpu=gpu.index,
                                      uuid=gpu.uuid, xid=f.xid, detail=f.detail)
                    add(finding, f.action, f.reason, "healthd")
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
    path = write_job_health(config.job_records_dir, record)
    _say("epilog", f"job {job}: {record.verdict.label}, {len(ordered)} finding(s) → {path}")
    hardware = record.worst_finding()
    if record.hardware_fault and hardware is not None:
        reason = DrainReason(kind=hardware.kind, action=hardware.action, at=utc(end), xid=hardware.xid,
                             gpu=hardware.gpu, uuid=hardware.uuid)
        _say("epilog", _drain(node, reason, slurm_factory))
    kill_strays(job)
    job_start_path(config.journal_dir, job).unlink(missing_ok=True)
    return 0


def _ancestors(pid: int) -> set[int]:
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def kill_strays(job: str) -> None:
    """Best effort: tasks of the job still alive after it ended (Slurm normally kills them).

    Only job tasks (they carry SLURM_PROCID) are touched, never this hook's own ancestry:
    slurmd's hook runner carries SLURM_JOB_ID too, and killing it fails the epilog.
    """
    spared = _ancestors(os.getpid())
    marker = f"SLURM_JOB_ID={job}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and any(v.startswith(b"SLURM_PROCID=") for v in env):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


def run_health_check(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode] = SlurmNode,
                     config: HealthdConfig | None = None) -> int:
    """Slurm's HealthCheckProgram: healthd's cached verdicts (milliseconds), else a quick direct check."""
    config = _setup("healthcheck", config)
    with _bounded("healthcheck", min(config.hook_timeout, 50.0), 0):  # Slurm kills it at 60 s
        return _health_check(environ, slurm_factory, config)


def _health_check(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode], config: HealthdConfig) -> int:
    node = environ.get("SLURMD_NODENAME") or config.node_name
    state, unusable = read_state(config)
    if unusable:
        _say("healthcheck", unusable)
    if state is not None and state_is_fresh(state, config, time.time()):
        problems = from_state(state, None)
        source = "healthd state"
    else:
        _say("healthcheck", "healthd is not running or its state is stale: checking NVML directly")
        problems = check_node(config, None).problems
        source = "direct check"
    if not problems:
        print(f"clusterctl-healthcheck: {node} healthy ({source})")
        return 0
    for problem in problems:
        _say("healthcheck", f"{node}: {problem.describe()} ({source})")
    # At slurmd start the node may not be registered yet: the Slurm command then fails or times out
    # (bounded), and the next run drains.
    _say("healthcheck", _drain(node, _problem_reason(problems[0]), slurm_factory))
    return 0
