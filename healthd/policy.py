"""The fault policy: which findings drain a node, and how (pure, versioned, shipped as data).

Derived from NVIDIA's Xid catalog and what DCGM, NVSentinel, gcm and Azure's checks
converge on (shared/notes/xid-policy.md).  Rules that peers got wrong are kept on purpose:
sympathetic Xids (8, 45) never count, app-level Xids drain only when the same GPU repeats
them across different jobs, the driver's own recovery action overrides the table, unknown
Xids warn unless promoted by configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from clusterctl.clock import utc
from clusterctl.healthd.findings import Action, Finding, Verdict
from clusterctl.records.drain_reason import REASON_PREFIX, DrainReason

__all__ = ["POLICY_VERSION", "REASON_PREFIX", "PolicyConfig", "drain_reason", "judge", "policy_rows"]

POLICY_VERSION = "2026.11.2"

# (xids, action, meaning) — the catalog rows, as data.
XID_TABLE: tuple[tuple[tuple[int, ...], Action, str], ...] = (
    ((8, 45), Action.IGNORE, "sympathetic / teardown after another error; never counted"),
    ((13, 31, 43, 68, 69, 137), Action.APP_FAULT, "application fault (bad kernel, page fault)"),
    ((63,), Action.RESET_AT_IDLE, "row remap recorded; reset when idle if a remap is pending"),
    ((92, 121), Action.WARN, "high corrected ECC / C2C rate; track the rate"),
    ((94,), Action.APP_FAULT, "contained ECC error, one application killed; reset when convenient"),
    ((48, 95, 140), Action.DRAIN_RESET, "uncontained / double-bit ECC error"),
    ((46, 62, 109, 110, 119, 120, 136, 143, 155, 158), Action.DRAIN_RESET, "GPU stopped / GSP / timeout"),
    ((64,), Action.DRAIN_RMA, "row remapping failed: memory can no longer be repaired"),
    ((74, 144, 145, 146, 147, 148, 149, 150), Action.DRAIN_RESET, "NVLink error"),
    ((79,), Action.DRAIN_REBOOT, "GPU has fallen off the bus"),
    ((154,), Action.DRAIN_RESET, "driver's recovery action pending (see recovery-action)"),
)

CONDITION_TABLE: tuple[tuple[str, Action, str], ...] = (
    ("gpu-lost", Action.DRAIN_REBOOT, "NVML reports the GPU lost"),
    ("gpu-missing", Action.DRAIN_REBOOT, "fewer GPUs than expected"),
    ("ecc-dbe", Action.DRAIN_RESET, "volatile uncorrectable ECC errors"),
    ("remap-failure", Action.DRAIN_RMA, "row remapping failure"),
    ("remap-uncorrectable", Action.DRAIN_RMA, "uncorrectable remapped rows at the limit (512)"),
    ("retired-pages", Action.DRAIN_RMA, "retired pages at the limit (63)"),
    ("remap-pending", Action.RESET_AT_IDLE, "row remap pending: reset the GPU when idle"),
    ("retired-pending", Action.RESET_AT_IDLE, "page retirement pending: reset the GPU when idle"),
    ("nvlink-down", Action.DRAIN_RESET, "an NVLink link is inactive"),
    ("thermal", Action.WARN, "temperature high"),
    ("thermal-sustained", Action.DRAIN_RESET, "temperature high for minutes"),
    ("clock-events", Action.WARN, "hardware slowdown / thermal / power-brake clock events, sustained"),
    ("nvml-hang", Action.WARN, "an NVML call hung (driver trouble)"),
    ("nvml-error", Action.WARN, "NVML returned an unexpected error"),
    ("host-memory", Action.WARN, "host memory nearly exhausted"),
    ("host-disk", Action.WARN, "a path is (nearly) full; users can fill it: warn only (see disk_drain_paths)"),
    ("host-disk-full", Action.DRAIN_RESET, "a path the site opted in to drain for (disk_drain_paths) is (nearly) full"),
    ("nvml-unavailable", Action.WARN, "NVML cannot be loaded or initialised: the GPUs cannot be judged"),
    ("host-readonly", Action.DRAIN_REBOOT, "a configured path is mounted read-only"),
)

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvmlDeviceGpuRecoveryAction_t).
RECOVERY_ACTIONS: Mapping[int, tuple[Action, str]] = {
    0: (Action.IGNORE, "driver: no action needed"),
    1: (Action.DRAIN_RESET, "driver asks for a GPU reset"),
    2: (Action.DRAIN_REBOOT, "driver asks for a node reboot"),
    3: (Action.DRAIN_RESET, "driver asks to drain peer-to-peer traffic"),
    4: (Action.DRAIN_RESET, "driver asks to drain P2P and reset"),
    5: (Action.DRAIN_RESET, "driver asks to recover the IMEX domain"),
    6: (Action.DRAIN_REBOOT, "driver asks for a PCIe bus reset"),
    7: (Action.DRAIN_REBOOT, "driver asks for a system reboot"),
}


@dataclass(frozen=True)
class PolicyConfig:
    """The knobs of the policy a site sets in healthd.toml."""

    promote_xids: Mapping[int, Action] = field(default_factory=dict)
    app_xid_repeat: int = 2
    """Same GPU, same app-level Xid class, in this many different jobs within the window → drain."""
    app_xid_window_s: float = 24 * 3600
    app_xid_count: str = "users"
    """What must differ between the repeats: "users" (one user's own buggy jobs never drain a
    node; a job whose user is unknown counts as its own user) or "jobs"."""

    def promoted(self, xid: int) -> Action | None:
        return self.promote_xids.get(xid)


_XID_INDEX = {xid: (action, meaning) for xids, action, meaning in XID_TABLE for xid in xids}
_CONDITION_INDEX = {kind: (action, meaning) for kind, action, meaning in CONDITION_TABLE}


def judge(finding: Finding, history: Iterable[Finding] = (), config: PolicyConfig = PolicyConfig()) -> Verdict:
    """The verdict for `finding`, given earlier findings on this node (for repeat rules)."""
    if finding.kind == "recovery-action":
        code = int(finding.value or 0)
        action, meaning = RECOVERY_ACTIONS.get(code, (Action.WARN, f"driver recovery action {code} (unknown)"))
        return Verdict(action, meaning, f"recovery-action {code}")
    if finding.kind == "xid" and finding.xid is not None:
        promoted = config.promoted(finding.xid)
        if promoted is not None:
            return Verdict(promoted, f"xid {finding.xid} promoted by configuration", f"config xid {finding.xid}")
        if finding.xid not in _XID_INDEX:
            return Verdict(Action.WARN, f"unknown xid {finding.xid}", "unknown xid")
        action, meaning = _XID_INDEX[finding.xid]
        if action is Action.APP_FAULT:
            jobs = _app_fault_jobs(finding, history, config)
            if len(jobs) >= config.app_xid_repeat:
                return Verdict(Action.DRAIN_RESET,
                               f"{meaning}, repeated on this GPU in {len(jobs)} different jobs "
                               f"({', '.join(sorted(jobs))}); diagnose", f"xid {finding.xid} repeated")
        return Verdict(action, meaning, f"xid {finding.xid}")
    if finding.kind in _CONDITION_INDEX:
        action, meaning = _CONDITION_INDEX[finding.kind]
        return Verdict(action, meaning, finding.kind)
    return Verdict(Action.WARN, f"unclassified finding {finding.kind}", "unclassified")


def _app_fault_jobs(finding: Finding, history: Iterable[Finding], config: PolicyConfig) -> set[str]:
    """The distinct jobs (or users' jobs) this GPU's app-level Xids happened in, within the window."""
    owners: dict[str, str] = {}  # job → who counts as its owner
    for seen in (*history, finding):
        if not (seen.kind == "xid" and seen.gpu == finding.gpu and seen.gpu is not None and seen.xid in _XID_INDEX
                and _XID_INDEX[seen.xid][0] is Action.APP_FAULT and finding.at - seen.at <= config.app_xid_window_s):
            continue
        # Only an Xid attributed to exactly one job is evidence: one seen while no job, or several
        # jobs, could own that GPU says nothing about the GPU.
        if len(seen.job_ids) != 1 or seen.job_ids[0] in ("unknown", ""):
            continue
        job = seen.job_ids[0]
        user = seen.users[0] if len(seen.users) == 1 and seen.users[0] else ""
        owners[job] = f"user {user}" if config.app_xid_count == "users" and user else f"job {job}"
    by_owner: dict[str, str] = {}
    for job, owner in sorted(owners.items()):
        by_owner.setdefault(owner, job)
    return set(by_owner.values())


def drain_reason(finding: Finding, verdict: Verdict, at: float) -> DrainReason:
    """The Slurm reason for draining over `finding`: `healthd: <what> gpu<N> (<uuid>) <action> <when>`.

    A kernel-log Xid for a GPU NVML can no longer name carries its PCI address instead of an index.
    """
    pci = finding.value if finding.gpu is None and finding.kind == "xid" and isinstance(finding.value, str) else None
    return DrainReason(kind=finding.kind, action=verdict.action, at=utc(at),
                       xid=finding.xid if finding.kind == "xid" else None, gpu=finding.gpu, pci=pci,
                       uuid=finding.uuid)


def policy_rows() -> list[tuple[str, str, str]]:
    """The whole table as (signal, action, meaning) rows, for `healthd policy`."""
    rows = [(f"xid {', '.join(map(str, xids))}", action.label, meaning) for xids, action, meaning in XID_TABLE]
    rows += [(kind, action.label, meaning) for kind, action, meaning in CONDITION_TABLE]
    rows += [(f"recovery-action {code}", action.label, meaning) for code, (action, meaning) in
             RECOVERY_ACTIONS.items()]
    rows.append(("xid (unknown)", Action.WARN.label, "warn; promote with [policy] promote_xids"))
    return rows
