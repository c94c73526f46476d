"""What the Slurm prolog, epilog and HealthCheckProgram do (their entry points are thin).

All three run as root with an empty environment, so PATH is set here, the configuration
is read from its default path, and every step is bounded by `hook_timeout`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from clusterctl.healthd.config import ConfigError, HealthdConfig, load_config
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import HOOK_PATH, GateReport, Problem, check_node, from_state, parse_job_gpus, state_is_fresh
from clusterctl.healthd.kmsg import RecordReader, parse_gpu_event
from clusterctl.healthd.policy import drain_reason, judge
from clusterctl.slurm.nodes import SlurmNode
from clusterctl.healthd.state_file import read_state
from clusterctl.errors import SlurmCommandError


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


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _drain(hook: str, node: str, problem: Problem, slurm_factory: Callable[[str], SlurmNode]) -> str:
    """Drain with an owned reason unless the node is already drained (by anyone)."""
    reason = drain_reason(problem.finding, problem.verdict, _utc(time.time()))
    slurm = slurm_factory(node)
    try:
        state = slurm.state()
        if state.draining:
            return f"already drained ({state.reason})"
        slurm.drain(reason)
        return f"drained: {reason}"
    except SlurmCommandError as exc:
        return f"could not drain ({exc})"


def _append_node_record(config: HealthdConfig, record: dict) -> None:
    config.journal_dir.mkdir(parents=True, exist_ok=True)
    with open(config.journal_dir / "node-record.jsonl", "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


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
    starts = config.journal_dir / "jobs"
    starts.mkdir(parents=True, exist_ok=True)
    (starts / f"{job}.json").write_text(json.dumps({"job": job, "start": time.time(), "gpus": gpus}))
    if report.ok:
        return 0
    for problem in report.problems:
        _say("prolog", f"job {job} refused on {node}: {problem.describe()}")
    outcome = _drain("prolog", node, report.problems[0], slurm_factory)
    _say("prolog", outcome)
    _append_node_record(config, {"at": _utc(time.time()), "hook": "prolog", "job": job, "node": node,
                                 "problems": [p.describe() for p in report.problems], "outcome": outcome})
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


def _epilog(environ: dict[str, str], slurm_factory: Callable[[str], SlurmNode], config: HealthdConfig,
            node_check: Callable[..., GateReport]) -> int:
    job = environ.get("SLURM_JOB_ID", "unknown")
    node = environ.get("SLURMD_NODENAME") or config.node_name
    gpus = parse_job_gpus(environ.get("SLURM_JOB_GPUS"))
    end = time.time()
    start_file = config.journal_dir / "jobs" / f"{job}.json"
    try:
        start = float(json.loads(start_file.read_text())["start"])
    except (OSError, ValueError, KeyError):
        start = end - 24 * 3600  # no prolog record: look back a day
    findings: dict[tuple, dict] = {}

    def add(finding: Finding, action: Action, reason: str, source: str) -> None:
        if gpus is not None and finding.gpu is not None and finding.gpu not in gpus:
            return
        key = (finding.gpu, finding.kind, finding.xid)
        entry = {"at": _utc(finding.at) if finding.at else None, "kind": finding.what, "gpu": finding.gpu,
                 "uuid": finding.uuid, "action": action.label, "reason": reason, "detail": finding.detail,
                 "source": source, "hardware": action.drains}
        if key not in findings or Action[findings[key]["action"].upper().replace("-", "_")] < action:
            findings[key] = entry

    state = read_state(config.state_dir)
    identities: dict[str, int] = {}
    if state:
        for index, gpu in state.get("gpus", {}).items():
            identities[gpu.get("pci_bus", "")] = int(index)
        for index, gpu in state.get("gpus", {}).items():
            for f in gpu.get("findings", []):
                at = f.get("at_ts")
                if at is None or start - 1 <= at <= end:
                    kind, _, number = f["kind"].partition(" ")
                    finding = Finding(kind, f.get("source", "healthd"), at or end, gpu=int(index),
                                      uuid=gpu.get("uuid", ""), xid=int(number) if number.isdigit() else None,
                                      detail=f.get("detail", ""))
                    action = Action[f["action"].upper().replace("-", "_")]
                    if action > Action.IGNORE:
                        add(finding, action, f["reason"], "healthd")
    for finding in _kernel_findings(config, start - 1, end, identities):
        verdict = judge(finding, (), config.policy)
        if verdict.action > Action.IGNORE:
            add(finding, verdict.action, verdict.reason, "kernel log")
    # What is still wrong now: from clusterctl.healthd when it is alive (cheap), else NVML directly.
    for problem in node_check(config, gpus, direct=not state_is_fresh(state, config, end)).problems:
        add(Finding(problem.finding.kind, "epilog", end, gpu=problem.finding.gpu, uuid=problem.finding.uuid,
                    detail=problem.finding.detail), problem.verdict.action, problem.verdict.reason, "epilog check")
    ordered = sorted(findings.values(), key=lambda e: (e["at"] or "", e["gpu"] if e["gpu"] is not None else -1))
    worst = max((Action[e["action"].upper().replace("-", "_")] for e in ordered), default=Action.IGNORE)
    record = {"job": job, "node": node, "gpus": gpus, "window": [_utc(start), _utc(end)],
              "findings": ordered, "verdict": worst.label, "hardware_fault": worst.drains,
              "exit_code": environ.get("SLURM_JOB_EXIT_CODE"), "written_at": _utc(time.time())}
    path = _write_job_record(config, job, node, record)
    _say("epilog", f"job {job}: {worst.label}, {len(ordered)} finding(s) → {path}")
    if worst.drains:
        hardware = next(e for e in ordered if Action[e["action"].upper().replace("-", "_")] == worst)
        finding = Finding(hardware["kind"].split(" ")[0], "epilog", end, gpu=hardware["gpu"], uuid=hardware["uuid"],
                          xid=int(hardware["kind"].split(" ")[1]) if hardware["kind"].startswith("xid ") else None)
        _say("epilog", _drain("epilog", node, Problem(finding, judge(finding, (), config.policy)), slurm_factory))
    _kill_strays(job)
    start_file.unlink(missing_ok=True)
    return 0


def _write_job_record(config: HealthdConfig, job: str, node: str, record: dict) -> Path:
    from clusterctl.healthd.gate import write_record

    return write_record(config.job_records_dir / job, f"{node}.json", record)


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


def _kill_strays(job: str) -> None:
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
    state = read_state(config.state_dir)
    if state_is_fresh(state, config, time.time()):
        problems = from_state(state, None)  # type: ignore[arg-type]
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
    _say("healthcheck", _drain("healthcheck", node, problems[0], lambda n: slurm_factory(n)))
    return 0

