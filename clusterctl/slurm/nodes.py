"""healthd's door to Slurm: read this node's state, drain it, resume it (argv lists, timeouts).

Node state comes from `sinfo --json` (Slurm 22.05 has it; `scontrol --json` it has not).
The reason is passed to scontrol as one argv element: it never meets a shell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from clusterctl.errors import SlurmCommandError
from clusterctl.records.drain_reason import REASON_PREFIX
from clusterctl.slurm.commands import Runner, run_checked, subprocess_runner


@dataclass(frozen=True)
class NodeState:
    """One node as `sinfo --json` shows it (state lower-cased, flags as Slurm spells them)."""

    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    partitions: tuple[str, ...]

    @property
    def draining(self) -> bool:
        """DRAIN is a flag on top of the base state in Slurm's JSON (idle+DRAIN = drained)."""
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def drained_by_us(self) -> bool:
        """Drained with healthd's reason prefix: healthd may resume it."""
        return self.draining and self.reason.startswith(REASON_PREFIX)

    @property
    def drained_by_someone_else(self) -> bool:
        """Drained by an admin or another tool: never ours to resume."""
        return self.draining and not self.reason.startswith(REASON_PREFIX)


def parse_sinfo_json(text: str) -> list[NodeState]:
    """Nodes from `sinfo --json` output."""
    data = json.loads(text)
    seen: dict[str, NodeState] = {}
    for node in data.get("nodes", []):
        name = node.get("name") or node.get("hostname")
        if name and name not in seen:
            seen[name] = NodeState(name, str(node.get("state", "")).lower(), tuple(node.get("state_flags") or ()),
                                   node.get("reason") or "", tuple(node.get("partitions") or ()))
    return list(seen.values())


class SlurmNode:
    """The Slurm operations healthd performs for one node."""

    def __init__(self, node: str, runner: Runner = subprocess_runner, timeout: float = 10.0) -> None:
        self.node, self.runner, self.timeout = node, runner, timeout

    def _run(self, argv: list[str]) -> str:
        return run_checked(self.runner, argv, self.timeout)

    def state(self) -> NodeState:
        """This node's state; SlurmCommandError when Slurm does not know it."""
        nodes = parse_sinfo_json(self._run(["sinfo", "--json", "-n", self.node]))
        for node in nodes:
            if node.name == self.node:
                return node
        raise SlurmCommandError(["sinfo", "--json", "-n", self.node], 0, f"node {self.node} not known to Slurm")

    def partition_nodes(self, partition: str) -> list[NodeState]:
        """Every node of a partition."""
        return parse_sinfo_json(self._run(["sinfo", "--json", "-p", partition]))

    def drain(self, reason: str) -> None:
        """Drain this node with the given reason (one argv element: no shell quoting)."""
        self._run(["scontrol", "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={reason}"])

    def resume(self) -> None:
        """Return this node to service."""
        self._run(["scontrol", "update", f"NodeName={self.node}", "State=RESUME"])

    def jobs_here(self) -> tuple[str, ...]:
        """Ids of the jobs running on this node (for attributing app-level Xids)."""
        out = self._run(["squeue", "-h", "-w", self.node, "-t", "RUNNING", "-o", "%A"])
        return tuple(line.strip() for line in out.splitlines() if line.strip())
