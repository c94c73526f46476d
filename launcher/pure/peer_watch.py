"""Neighbours watching each other: which nodes of a step beat to which, and when one is silent.

Every node's reporter sends a beat (clusterctl.records.peer_beat) to its two neighbours on a ring
over the step's nodes, in the order Slurm lists them (`SLURM_STEP_NODELIST` expanded: on most
clusters that follows racks and leaf switches, so a beat crosses one switch), every
PEER_BEAT_SECONDS, and watches the beats of the same two.  A neighbour heard before and silent
for PEER_SILENT_SECONDS is named in the watcher's next report to the agent, sent at once: the
signal is PEER_SILENT_SECONDS late at any job size, where the reports' own heartbeat (20 s at
12,500 nodes) makes the agent's silence a minute late.  The agent does not act on one witness:
it probes the node itself (launcher/job/node_probe.py) and blames it only when that fails too
(launcher/pure/reachability.py).

A neighbour that said it is leaving (its step ended there) is not watched any more; one never heard
from is not called silent (its reporter may start later: the agent's startup grace covers it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from clusterctl.records.node_report import SilentPeer

PEER_BEAT_SECONDS = 0.5
"""Seconds between two beats of a node to each neighbour."""
PEER_SILENT_SECONDS = 2.5
"""A neighbour silent this long (five beats: with 1% of datagrams lost, five in a row are lost once in
10^10 windows, about once in 50 hours over the 25,000 watches of a 12,500-node job; and a suspicion
is only that: bench/peer_watch_bench.py) is named silent."""


def neighbours(nodes: Sequence[str], node: str) -> tuple[str, ...]:
    """The nodes `node` beats to and watches: the one before and the one after it on the ring over
    `nodes` (one for a step of two nodes, none for a step of one or a node not in the step)."""
    if node not in nodes:
        return ()
    ring = list(dict.fromkeys(nodes))
    if len(ring) < 2:
        return ()
    at = ring.index(node)
    before, after = ring[at - 1], ring[(at + 1) % len(ring)]
    return (before,) if before == after else (before, after)


@dataclass(frozen=True)
class PeerWatch:
    """What one node knows of its neighbours' beats (times: its own monotonic clock)."""

    peers: tuple[str, ...]
    heard_at: Mapping[str, float] = field(default_factory=dict)
    left: frozenset[str] = frozenset()
    """Neighbours that said their step ended there."""

    def heard(self, node: str, at: float, *, leaving: bool = False) -> PeerWatch:
        """A beat of `node` arrived at `at` (a node that is not a neighbour is ignored)."""
        if node not in self.peers:
            return self
        if leaving:
            return replace(self, left=self.left | {node})
        return replace(self, heard_at={**self.heard_at, node: at}, left=self.left - {node})

    def silent(self, at: float) -> tuple[SilentPeer, ...]:
        """The neighbours heard before, not leaving, and silent PEER_SILENT_SECONDS or more at `at`."""
        return tuple(SilentPeer(node, round(at - heard, 1)) for node in self.peers
                     if node not in self.left and (heard := self.heard_at.get(node)) is not None
                     and at - heard >= PEER_SILENT_SECONDS)
