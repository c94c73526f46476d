"""The node gate shared by the Slurm prolog, the epilog and HealthCheckProgram.

It answers "may work run here?" with the daemon's own engine, policy and sampler:
healthd's state file (instant, when the daemon is alive) plus a quick direct NVML look at
the GPUs in question, with hard time limits.  Hooks run as root with an empty
environment (no PATH, no SLURM_CONF) and must never hang; everything here is bounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.healthd.checks import Sustained, check_host
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.engine import blocking_in_state, blocks_new_work, gate_verdict
from clusterctl.healthd.findings import Action, Finding, FindingKind, Verdict
from clusterctl.records.healthd_state import HealthdState, read_healthd_state
from clusterctl.records.versioned import RecordError

__all__ = ["HOOK_PATH", "GateReport", "Problem", "blocks_new_work", "check_node", "direct_check", "from_state",
           "gpu_index_list", "gpus_expected", "healthd_alive", "nvidia_gpus_on_pci", "nvml_unusable",
           "parse_job_gpus", "read_state", "state_is_fresh"]

# Hooks get no PATH: Slurm's commands and coreutils live here on Debian and most distributions.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Problem:
    """A finding that keeps work off this node (or GPU), with the verdict that says so."""

    finding: Finding
    verdict: Verdict

    def describe(self) -> str:
        """`gpu2 gpu-lost: NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST) → drain-reboot`."""
        where = f"gpu{self.finding.gpu} " if self.finding.gpu is not None else ""
        detail = f" ({self.finding.detail})" if self.finding.detail else ""
        return f"{where}{self.finding.what}: {self.verdict.reason}{detail} → {self.verdict.action.label}"


@dataclass
class GateReport:
    """What the gate found: blocking problems, warnings, and how it knows (daemon or direct)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    healthd_fresh: bool = False
    gpus_unchecked: str | None = None
    """Why the direct check could not judge the GPUs at all (NVML library not found, its init failed), if so:
    then no GPU problem is known, which is not the same as none."""

    @property
    def ok(self) -> bool:
        """Nothing blocks work here."""
        return not self.problems


MAX_GPU_INDEX_DIGITS = 4
"""A GPU index has at most this many digits (no node has 10,000 GPUs): a list stays small to read."""


def gpu_index_list(value: str) -> list[int]:
    """Slurm's list of a job's GPUs on a node ("0,1,3": SLURM_JOB_GPUS in the hooks, SLURM_STEP_GPUS in
    a step; also `healthd evidence --gpus`) → [0, 1, 3], sorted, each once.

    Slurm writes the indexes in its node's gres.conf order (`File=`), comma-separated, nothing else
    (spaces around an index are let pass, for people typing --gpus).  Raises ValueError saying what is wrong with anything else (an empty list or entry, a range such as
    "0-3", a sign, a non-ASCII digit, more than MAX_GPU_INDEX_DIGITS digits).
    """
    parts = [part.strip(" \t") for part in value.split(",")]
    for part in parts:
        if not (part.isascii() and part.isdigit()) or len(part) > MAX_GPU_INDEX_DIGITS:
            shown = part if len(part) <= 20 else part[:20] + "..."
            raise ValueError(f"{shown!r} is not a GPU index (expected indexes separated by commas, e.g. 0,1,3)")
    return sorted({int(part) for part in parts})


def parse_job_gpus(value: str | None) -> list[int] | None:
    """SLURM_JOB_GPUS ("0,1,3") → [0, 1, 3]; None when unset or not a GPU list (then: all GPUs)."""
    if not value:
        return None
    try:
        return gpu_index_list(value)
    except ValueError:
        return None


def read_state(config: HealthdConfig) -> tuple[HealthdState | None, str | None]:
    """healthd's state file, or None and why it cannot be used (a file from a newer healthd, damaged...)."""
    try:
        return read_healthd_state(config.state_dir), None
    except RecordError as exc:
        return None, f"healthd's state not usable: {exc}"


def state_is_fresh(state: HealthdState | None, config: HealthdConfig, now: float) -> bool:
    """The daemon wrote its state recently and is still running."""
    if state is None:
        return False
    max_age = max(3 * config.check_interval, 30.0)
    return healthd_alive(state.pid) and now - state.updated_at <= max_age


def healthd_alive(pid: int) -> bool:
    """The process runs healthd and is not a zombie (a killed daemon may linger unreaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX" and b"healthd" in cmdline


def from_state(state: HealthdState, gpus: list[int] | None) -> list[Problem]:
    """Blocking verdicts healthd already holds for these GPUs (and the node as a whole)."""
    return [Problem(finding, verdict) for finding, verdict in blocking_in_state(state, gpus)]


def direct_check(config: HealthdConfig, gpus: list[int] | None, *, nvml_timeout: float = 2.0) -> GateReport:
    """Ask NVML directly (bounded) about these GPUs, plus the GPU count and the host paths."""
    from clusterctl.healthd.sampler import sample_host

    report = GateReport()
    now = time.time()
    findings: list[Finding] = []
    try:
        from clusterctl.healthd.nvml import Nvml, NvmlError, NvmlHang, TimedCalls
        from clusterctl.healthd.sampler import scan_gpus

        nvml = Nvml(TimedCalls(nvml_timeout, max_abandoned=1))
        try:
            nvml.init()
            # A hook sees one instant: only immediate conditions count (a fresh Sustained).
            findings += scan_gpus(nvml, config.checks, Sustained(), now, source="prolog", gpus=gpus).findings
        except NvmlHang as exc:
            findings.append(Finding("nvml-hang", "prolog", now, value=exc.function, detail=str(exc)))
        except NvmlError as exc:
            # NVML that cannot be loaded or initialised (no library, no driver, no permission) looks the
            # same on every node at once: it says nothing about this node's GPUs ("cannot judge").
            kind: FindingKind = "nvml-unavailable" if not nvml.initialised else "nvml-error"
            findings.append(Finding(kind, "prolog", now, detail=f"NVML: {exc}"))
            if not nvml.initialised:
                report.gpus_unchecked = nvml_unusable(exc)
    except ImportError as exc:  # pragma: no cover - a broken install
        report.notes.append(f"pynvml unavailable: {exc}")
        report.gpus_unchecked = f"NVML bindings (pynvml) cannot be imported: {exc}"
    findings += check_host(sample_host(config.watched_disk_paths), config.checks, now, config.disk_drain_paths)
    for finding in findings:
        verdict = gate_verdict(finding, config.policy)
        if blocks_new_work(verdict.action):
            report.problems.append(Problem(finding, verdict))
        elif verdict.action > Action.IGNORE:
            report.notes.append(Problem(finding, verdict).describe())
    return report


NVML_LIBRARY_NOT_FOUND = 12
"""NVML_ERROR_LIBRARY_NOT_FOUND: nvmlInit found no libnvidia-ml (no NVIDIA driver installed)."""


def nvml_unusable(exc: Exception) -> str:
    """Why NVML could not be initialised, for a person: the library is missing, or its init failed."""
    if getattr(exc, "value", None) == NVML_LIBRARY_NOT_FOUND:
        return "NVML library not found (libnvidia-ml: is the NVIDIA driver installed?)"
    return f"NVML init error: {exc}"


PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
"""PCI classes of a GPU: VGA-compatible controller, 3D controller (data-centre GPUs)."""


def nvidia_gpus_on_pci(devices: Path = PCI_DEVICES) -> int:
    """NVIDIA GPUs the PCI bus shows (sysfs vendor and class): what the node has, whether or not NVML works."""
    count = 0
    try:
        entries = list(devices.iterdir())
    except OSError:
        return 0
    for entry in entries:
        try:
            vendor = (entry / "vendor").read_text().strip().lower()
            kind = (entry / "class").read_text().strip().lower()
        except OSError:
            continue
        count += vendor == NVIDIA_VENDOR and kind.startswith(GPU_CLASSES)
    return count


def gpus_expected(config: HealthdConfig, devices: Path = PCI_DEVICES) -> tuple[bool, str]:
    """Whether this node has GPUs to judge (healthd.toml `gpus_expected`; "auto": NVIDIA GPUs on the PCI
    bus), and why, for the line that says so."""
    if config.gpus_expected is True:
        return True, "gpus_expected = true"
    if config.gpus_expected is False:
        return False, "gpus_expected = false"
    count = nvidia_gpus_on_pci(devices)
    if count:
        return True, f"{count} NVIDIA GPU(s) on the PCI bus"
    return False, "no NVIDIA GPU on the PCI bus"


def check_node(config: HealthdConfig, gpus: list[int] | None, *, direct: bool = True) -> GateReport:
    """The whole gate: healthd's verdicts when it is alive, and a direct NVML look."""
    now = time.time()
    state, unusable = read_state(config)
    fresh = state_is_fresh(state, config, now)
    report = direct_check(config, gpus) if direct or not fresh else GateReport()
    report.healthd_fresh = fresh
    if unusable:
        report.notes.append(unusable)
    if fresh and state is not None:
        report.problems += from_state(state, gpus)
    else:
        report.notes.append("healthd is not running or its state is stale: checked NVML directly")
    return report
