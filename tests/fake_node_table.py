"""Slurm's node table for tests of the drain door: answers the argv `SlurmNode` really runs
(`sinfo -h -n N -o %N|%T|%P|%E`, `sinfo -h -p P -o %D|%T|%E`, `scontrol update NodeName=...`) in the
shapes Slurm 22.05 prints them, and keeps every argv it was given."""

from __future__ import annotations

from collections.abc import Sequence

from clusterctl.slurm.commands import Completed


class FakeNodeTable:
    """A partition of nodes, each idle or drained with a reason (`drained`: node → reason)."""

    def __init__(self, nodes: Sequence[str], drained: dict[str, str] | None = None, partition: str = "gpu",
                 down: Sequence[str] = ()) -> None:
        self.nodes, self.partition = list(nodes), partition
        self.reasons = dict(drained or {})
        self.down = set(down)
        self.calls: list[list[str]] = []
        self.drains: list[tuple[str, str]] = []
        """(node, reason) of every drain made."""

    def _state(self, node: str) -> str:
        if node in self.reasons:
            return "drained" if node not in self.down else "down+drain"
        return "down*" if node in self.down else "idle"

    def updates(self) -> list[list[str]]:
        """Every `scontrol update` given."""
        return [argv for argv in self.calls if argv[:2] == ["scontrol", "update"]]

    def __call__(self, argv: Sequence[str], timeout: float) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:3] == ["sinfo", "-h", "-n"]:
            node = argv[3]
            if node not in self.nodes:
                return Completed(0, "", "")
            reason = self.reasons.get(node, "not responding" if node in self.down else "none")
            return Completed(0, f"{node}|{self._state(node)}|{self.partition}*|{reason}\n", "")
        if argv[:3] == ["sinfo", "-h", "-p"]:
            groups: dict[tuple[str, str], int] = {}
            for node in self.nodes:
                key = (self._state(node), self.reasons.get(node, "none"))
                groups[key] = groups.get(key, 0) + 1
            return Completed(0, "".join(f"{count}|{state}|{reason}\n" for (state, reason), count in groups.items()), "")
        if argv[:2] == ["scontrol", "update"]:
            fields = dict(arg.split("=", 1) for arg in argv[2:])
            if fields.get("State") == "DRAIN":
                self.reasons[fields["NodeName"]] = fields["Reason"]
                self.drains.append((fields["NodeName"], fields["Reason"]))
            elif fields.get("State") == "RESUME":
                self.reasons.pop(fields["NodeName"], None)
            return Completed(0, "", "")
        return Completed(1, "", f"unexpected command {argv}")
