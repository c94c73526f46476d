"""The node gate shared by the Slurm prolog, the epilog and HealthCheckProgram.

It answers "may work run here?" from the same checks and policy as the daemon:
healthd's state file (instant, when the daemon is alive) plus a quick direct NVML look at
the GPUs in question, with hard time limits.  Hooks run as root with an empty
environment (no PATH, no SLURM_CONF) and must never hang; everything here is bounded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.healthd.checks import Sustained, check_gpu, check_gpu_count, check_host
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.findings import Action, Finding, Verdict
from clusterctl.healthd.policy import judge
from clusterctl.healthd.state_file import read_state

# Hooks get no PATH: Slurm's commands and coreutils live here on Debian and most distributions.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def blocks_new_work(action: Action) -> bool:
    """A GPU needing a drain, or a reset before its next job (pending remap/retirement), takes no job."""
    return action.drains or action is Action.RESET_AT_IDLE


@dataclass(frozen=True)
class Problem:
    finding: Finding
    verdict: Verdict

    def describe(self) -> str:
        where = f"gpu{self.finding.gpu} " if self.finding.gpu is not None else ""
        detail = f" ({self.finding.detail})" if self.finding.detail else ""
        return f"{where}{self.finding.what}: {self.verdict.reason}{detail} → {self.verdict.action.label}"


@dataclass
class GateReport:
    """What the gate found: blocking problems, warnings, and how it knows (daemon or direct)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    healthd_fresh: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_job_gpus(value: str | None) -> list[int] | None:
    """SLURM_JOB_GPUS ("0,1,3") → [0, 1, 3]; None when unset or not numeric (then: all GPUs)."""
    if not value:
        return None
    try:
        return sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        return None


def state_is_fresh(state: dict | None, config: HealthdConfig, now: float) -> bool:
    """The daemon wrote its state recently and is still running."""
    if not state:
        return False
    max_age = max(3 * config.check_interval, 30.0)
    pid = state.get("pid")
    return isinstance(pid, int) and healthd_alive(pid) and now - float(state.get("updated_at", 0)) <= max_age


def healthd_alive(pid: int) -> bool:
    """The process runs healthd and is not a zombie (a killed daemon may linger unreaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX" and b"healthd" in cmdline


def from_state(state: dict, gpus: list[int] | None) -> list[Problem]:
    """Blocking verdicts healthd already holds for these GPUs (and the node as a whole)."""
    problems = []
    for index, gpu in state.get("gpus", {}).items():
        if gpus is not None and int(index) not in gpus:
            continue
        for f in gpu.get("findings", []):
            action = Action[f["action"].upper().replace("-", "_")]
            if blocks_new_work(action) and not f.get("acknowledged") and not f.get("handled"):
                finding = Finding(f["kind"].split(" ")[0], "healthd", 0.0, gpu=int(index), uuid=gpu.get("uuid", ""),
                                  xid=int(f["kind"].split(" ")[1]) if f["kind"].startswith("xid ") else None,
                                  detail=f.get("detail", ""))
                problems.append(Problem(finding, Verdict(action, f["reason"], "healthd state")))
    for f in state.get("node_findings", []):
        action = Action[f["action"].upper().replace("-", "_")]
        if blocks_new_work(action) and not f.get("acknowledged") and not f.get("handled"):
            problems.append(Problem(Finding(f["kind"], "healthd", 0.0, detail=f.get("detail", "")),
                                    Verdict(action, f["reason"], "healthd state")))
    return problems


def direct_check(config: HealthdConfig, gpus: list[int] | None, *, nvml_timeout: float = 2.0) -> GateReport:
    """Ask NVML directly (bounded) about these GPUs, plus the GPU count and the host paths."""
    report = GateReport()
    now = time.time()
    findings: list[Finding] = []
    try:
        import pynvml

        from clusterctl.healthd.nvml import Nvml, NvmlHang, TimedCalls

        nvml = Nvml(TimedCalls(nvml_timeout, max_abandoned=1))
        try:
            nvml.init()
            count = nvml.count()
            findings += check_gpu_count(count, config.checks, now)
            sustained = Sustained()  # a hook sees one instant: only immediate conditions count
            for index in (gpus if gpus is not None else range(count)):
                if index >= count:
                    findings.append(Finding("gpu-missing", "prolog", now, gpu=index,
                                            detail=f"the job's GPU {index} is not enumerated"))
                    continue
                findings += check_gpu(nvml.sample(index), config.checks, sustained, now)
        except NvmlHang as exc:
            findings.append(Finding("nvml-hang", "prolog", now, value=exc.function, detail=str(exc)))
        except pynvml.NVMLError as exc:
            findings.append(Finding("nvml-error", "prolog", now, detail=f"NVML: {exc}"))
    except ImportError as exc:  # pragma: no cover - a broken install
        report.notes.append(f"pynvml unavailable: {exc}")
    findings += check_host(_host_sample(config), config.checks, now)
    for finding in findings:
        verdict = judge(finding, (), config.policy)
        if blocks_new_work(verdict.action) or finding.kind in ("nvml-hang", "nvml-error"):
            # A driver that hangs or errors at job start is not a place to start a job.
            if not blocks_new_work(verdict.action):
                verdict = Verdict(Action.DRAIN_RESET, verdict.reason, verdict.rule)
            report.problems.append(Problem(finding, verdict))
        elif verdict.action > Action.IGNORE:
            report.notes.append(Problem(finding, verdict).describe())
    return report


def _host_sample(config: HealthdConfig):
    import shutil

    from clusterctl.healthd.checks import HostSample

    free = {}
    readonly = []
    for path in config.disk_paths:
        try:
            usage = shutil.disk_usage(path)
            free[path] = usage.free / usage.total if usage.total else 1.0
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                readonly.append(path)
        except OSError:
            continue
    return HostSample(1.0, free, tuple(readonly))


def check_node(config: HealthdConfig, gpus: list[int] | None, *, direct: bool = True) -> GateReport:
    """The whole gate: healthd's verdicts when it is alive, and a direct NVML look."""
    now = time.time()
    state = read_state(config.state_dir)
    fresh = state_is_fresh(state, config, now)
    report = direct_check(config, gpus) if direct or not fresh else GateReport()
    report.healthd_fresh = fresh
    if fresh:
        report.problems += from_state(state, gpus)  # type: ignore[arg-type]
    else:
        report.notes.append("healthd is not running or its state is stale: checked NVML directly")
    return report


def write_record(directory: Path, name: str, record: dict) -> Path:
    """Write a JSON record atomically (temp file + rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    final = directory / name
    os.replace(tmp, final)
    return final
