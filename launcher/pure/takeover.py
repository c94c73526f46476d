"""When a standby agent takes a job over from the active one (decided here only; the standby asks).

The active agent runs in the batch script, on the allocation's first node; when that node dies
Slurm, for a job submitted with --no-kill, takes it out of the job and keeps the job RUNNING with
nobody to run steps (seen on 22.05, 24.11 and 26.05; README "Recovery inside the allocation").  The
standby, on another node of the allocation, then takes over -- but only on two agreeing signs:

1. the active agent has gone quiet: its summary (rewritten every `interval` s while it watches a
   step) is older than `silent_after` (three intervals and 1 s) -- cheap, read on the standby's
   node every second, and the only thing read while all is well;
2. Slurm agrees its node is gone: it took the node out of the job (as it does when it declares
   the node DOWN; a --no-kill job runs on without it).

The second sign is the fence (docs/architecture.md, "One agent acts"): an agent's every action
(a step, a shrink, the job's end) is an RPC to slurmctld.  A node slurmctld cannot reach has lost
its path to slurmctld too, so the old agent cannot act while the new one does; once Slurm has taken
the node out of the job, the node's slurmd kills the job's processes there (the old agent among
them) as soon as it can talk to slurmctld again.  The epoch lease (clusterctl.records.agent_lease)
covers what does not go through Slurm (the journal): each agent checks it before acting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.slurm.nodes import NodeState


@dataclass(frozen=True)
class Quiet:
    """How quiet the active agent is at `now` (the standby's clock, epoch s)."""

    summary_at: float | None
    """When the watcher saw the active agent's summary change last (its own clock; None: never)."""
    watching_since: float
    """When the watcher started watching (an agent that has written no summary yet is new)."""
    interval: float
    """Its summary's rewrite interval (s)."""

    def silent_for(self, now: float) -> float:
        """Seconds since the active agent was last heard of."""
        return now - max(self.summary_at or 0.0, self.watching_since)

    def silent(self, now: float) -> bool:
        """True when it is past three rewrite intervals and one second."""
        return self.silent_for(now) > 3 * self.interval + 1.0


@dataclass(frozen=True)
class Takeover:
    """The standby takes over from `node`; `evidence` says why, in words a user reads in the journal."""

    node: str
    evidence: tuple[str, ...]
    left_job: bool = False
    """Slurm already took the node out of the job (nothing to give back)."""


def takeover(active_node: str, quiet: Quiet, now: float, state: NodeState | None,
             job_nodes: Sequence[str] | None) -> Takeover | None:
    """Whether the standby takes over at `now` from the agent on `active_node`, given what Slurm says of
    that node (`state`: None when it could not be read) and the job's nodes (None: not read).

    Only a node Slurm took out of the job counts: Slurm does that when it declares the node DOWN (a
    --no-kill job keeps running without it).  Not responding is not enough: a step started while
    Slurm still counts the node in the job is killed when Slurm then takes the node out (seen on
    24.11), and the batch host cannot be given back by hand (`scontrol update` refuses it)."""
    if not quiet.silent(now) or job_nodes is None or active_node in job_nodes:
        return None
    heard = f"the agent on {active_node} silent for {quiet.silent_for(now):.1f} s (summary every {quiet.interval:g} s)"
    said = f"Slurm: {active_node} left the job (the job runs on {len(job_nodes)} nodes without it)"
    if state is not None:
        said += f"; {active_node} is {state.state} {list(state.flags)}"
    return Takeover(active_node, (heard, said), left_job=True)
