"""healthd at the drain door (clusterctl/slurm/drains.py): its rules, its requests, the door's verdict as
healthd journals it.  Used by the applier (healthd/applier.py) and by the prolog, epilog and
HealthCheckProgram (through healthd/hook_common.py `drain_node`), which drain with the daemon's own rules.

A hook drains for a `DrainReason` it holds.  The daemon's applier drains for a planned action, which
was journaled before it is applied and may be one a restarted healthd found pending: its reason is
the journal's text, read back as every reader of a drain reason reads one (`parse_drain_reason`).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.clock import utc
from clusterctl.healthd.engine import ApplyDecision, EngineSettings
from clusterctl.records.drain_reason import HEALTHD, parse_drain_reason
from clusterctl.slurm.drain_owners import DrainOwner
from clusterctl.records.healthd_actions import PlannedAction
from clusterctl.records.healthd_state import Alert
from clusterctl.slurm import drains
from clusterctl.slurm.nodes import NodeState, PartitionShare


def drain_rules(settings: EngineSettings) -> drains.DrainRules:
    """healthd's rules at the drain door: its `healthd:` reasons, its breaker's share of the partition,
    and a node Slurm took down may still be drained for a fault found on it."""
    return drains.DrainRules(HEALTHD, settings.breaker_max_share, settings.partition, settings.dry_run,
                             over_down=True)


def planned_request(settings: EngineSettings, action: PlannedAction) -> drains.DrainRequest:
    """A planned action as the drain door's request for this node (a resume needs no reason: the door
    lifts only healthd's own drain)."""
    if action.op == "resume":
        return drains.DrainRequest(settings.node, "resume")
    return drains.DrainRequest(settings.node, "drain", parse_drain_reason(action.reason) or JournaledReason(action.reason))


@dataclass(frozen=True)
class JournaledReason:
    """A reason healthd journaled that the parser cannot read back (text from the driver it did not expect, say):
    still healthd's own, sent to Slurm as written, as it was before reasons were typed.  A fault must never go
    undrained because its reason's text is unusual."""

    text: str
    owner: DrainOwner = HEALTHD

    def render(self) -> str:
        """The journaled text, as written."""
        return self.text


def breaker_partition(settings: EngineSettings, action: PlannedAction, node: NodeState) -> str | None:
    """The partition whose drained share the breaker must see before this action (None: no need to ask)."""
    return drains.cap_partition(drain_rules(settings), planned_request(settings, action), node)


def apply_decision(reason: str, verdict: drains.DrainVerdict, now: float) -> ApplyDecision:
    """The drain door's verdict on a drain for `reason` as healthd journals it (a refusal by the breaker
    raises an alert)."""
    alert = Alert(utc(now), "breaker-open", reason, verdict.detail) if verdict.result == "breaker-open" else None
    return ApplyDecision(verdict.result, verdict.call, alert)


def decide_apply(settings: EngineSettings, action: PlannedAction, node: NodeState,
                 share: PartitionShare | None, now: float) -> ApplyDecision:
    """Apply `action` to `node` as Slurm shows it now?  The drain door's rules (drains.decide) for
    healthd: never overwrites another drain (an admin's, another tool's, a straggler verdict's); never
    lifts one that is not healthd's; refuses (and alerts) rather than drain more than the breaker's
    share of the partition (`share`: that partition, as asked for by `breaker_partition`).
    """
    verdict = drains.decide(drain_rules(settings), planned_request(settings, action), node, share)
    return apply_decision(action.reason, verdict, now)
