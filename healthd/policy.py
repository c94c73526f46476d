"""The fault policy: which findings drain a node, and how (pure, versioned, shipped as data).

Each check family (healthd/checks/) declares its own rows; this module gathers them and judges a
finding by them.  Rules that peers got wrong are kept on purpose (shared/notes/xid-policy.md):
sympathetic Xids (8, 45) never count, app-level Xids drain only when the same GPU repeats them
across different jobs, the driver's own recovery action overrides the table, unknown Xids warn
unless promoted by configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from clusterctl.clock import utc
from clusterctl.healthd.checks import FAMILIES, Condition
from clusterctl.healthd.checks.recovery import RECOVERY_ACTIONS, recovery_verdict
from clusterctl.healthd.checks.xid import XID_TABLE
from clusterctl.healthd.findings import Action, Finding, Verdict
from clusterctl.records.drain_reason import REASON_PREFIX, DrainReason, as_evidence

__all__ = ["CONDITION_TABLE", "POLICY_VERSION", "RECOVERY_ACTIONS", "REASON_PREFIX", "XID_TABLE", "PolicyConfig",
           "drain_reason", "judge", "policy_rows"]

POLICY_VERSION = "2026.11.3"


def _in_shown_order(conditions: Sequence[Condition]) -> tuple[tuple[str, Action, str], ...]:
    """The families' rows in family order, each row with a `shown_before` moved just before that kind's."""
    rows = [c for c in conditions if not c.shown_before]
    for moved in (c for c in conditions if c.shown_before):
        rows.insert(next(i for i, c in enumerate(rows) if c.kind == moved.shown_before), moved)
    return tuple((c.kind, c.action, c.meaning) for c in rows)


CONDITION_TABLE: tuple[tuple[str, Action, str], ...] = _in_shown_order(
    [condition for family in FAMILIES for condition in family.conditions])
"""(kind, action, meaning) of every kind judged by its kind alone."""


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
_EVIDENCE_IN_REASON = frozenset(c.kind for family in FAMILIES for c in family.conditions if c.evidence_in_reason)


def judge(finding: Finding, history: Iterable[Finding] = (), config: PolicyConfig = PolicyConfig()) -> Verdict:
    """The verdict for `finding`, given earlier findings on this node (for repeat rules)."""
    if finding.kind == "recovery-action":
        code = int(finding.value or 0)
        action, meaning = recovery_verdict(code)
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

    A kernel-log Xid for a GPU NVML can no longer name carries its PCI address instead of an index; the
    checks whose rows ask for it (network, PCIe, NVLink errors, storage) add their evidence in brackets.
    """
    pci = finding.value if finding.gpu is None and finding.kind == "xid" and isinstance(finding.value, str) else None
    return DrainReason(kind=finding.kind, action=verdict.action, at=utc(at),
                       xid=finding.xid if finding.kind == "xid" else None, gpu=finding.gpu, pci=pci,
                       uuid=finding.uuid,
                       evidence=as_evidence(finding.detail) if finding.kind in _EVIDENCE_IN_REASON else "")


def policy_rows() -> list[tuple[str, str, str]]:
    """The whole table as (signal, action, meaning) rows, for `healthd policy`."""
    rows = [(f"xid {', '.join(map(str, xids))}", action.label, meaning) for xids, action, meaning in XID_TABLE]
    rows += [(kind, action.label, meaning) for kind, action, meaning in CONDITION_TABLE]
    rows += [(f"recovery-action {code}", action.label, meaning) for code, (action, meaning) in
             RECOVERY_ACTIONS.items()]
    rows.append(("xid (unknown)", Action.WARN.label, "warn; promote with [policy] promote_xids"))
    return rows
