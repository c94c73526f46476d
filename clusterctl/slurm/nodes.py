"""Nodes as Slurm reports them, from every release's JSON, and healthd's door to its own node.

Each release shapes node JSON differently (measured on Debian's 22.05.8, 24.11.5 and 26.05.5;
recorded from SchedMD's 23.02.8, whose v0.0.39 shapes nodes as 23.11+ does):
- 22.05 (openapi v0.0.38): `sinfo --json` prints every node flat, `{"nodes": [{"name", "state":
  "idle", "state_flags": ["DRAIN"], "reason", "partitions"}]}`, and ignores `-n`/`-p`/`-N`;
  scontrol has no `--json`.
- 23.02 on (v0.0.39+): `scontrol show node [N] --json` prints `{"nodes": [{"name", "state":
  ["IDLE", "DRAIN"], "reason", "partitions"}]}` (base state and flags in one list);
  `sinfo --json` prints `{"sinfo": [groups]}`, one group per partition and state, each with
  `node.state` (a list), `nodes.nodes` (the names) and ONE `reason` — its first node's.  A
  group of several nodes therefore cannot say why each is drained; such a group is refused
  unless none of its nodes can have a reason (`sinfo --json -N` gives one node per group).

- What a read costs slurmctld (bench/fleet_bench.py --probe, 12,500 nodes, 22.05.8 and 26.05.5):
  `sinfo -n N` with a text format is one single-node RPC (REQUEST_NODE_INFO_SINGLE, 0.1-0.5 ms)
  on every release, so healthd reads its own node that way (`parse_one_node_text`);
  `scontrol show node N` (text or --json) and 22.05's `sinfo --json -n N` ask for the whole
  table (REQUEST_NODE_INFO, 15-73 ms).  Any other `sinfo` is a whole-table RPC whatever its
  filters; grouped by state and reason (`-o %D|%T|%E`) it prints a few KB instead of 15 MB of
  JSON, which is how the drain breaker counts a partition (`parse_partition_share`).

Every shape becomes the same `NodeState`.  What this module cannot read is a SlurmVersionError
naming the release, the command and the field, never a node read as healthy.
The reason is passed to scontrol as one argv element: it never meets a shell.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clusterctl.errors import HostlistError, SlurmCommandError
from clusterctl.slurm.drain_owners import HEALTHD, DrainOwner, owner_of
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Runner, ask_version, run_checked, subprocess_runner
from clusterctl.slurm.version import SlurmVersion, SlurmVersionError

BASE_STATES = frozenset({"INVALID", "UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})
"""A node's base state (NODE_STATE_BASE in slurm.h); every other word of a state list is a flag."""

REASON_FLAGS = frozenset({"DRAIN", "FAIL"})
"""Flags that come with a reason (besides the base state DOWN): Slurm only keeps a reason for these."""


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm shows it: base state lower-cased (`idle`), flags as Slurm spells them."""

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
    def down(self) -> bool:
        """Slurm took the node out of service itself (base state DOWN, or FAIL)."""
        return self.state.startswith("down") or "FAIL" in self.flags

    @property
    def drain_owner(self) -> DrainOwner | None:
        """Whose drain this is, by its reason's prefix (None: not drained, or an admin's / another tool's)."""
        return owner_of(self.reason) if self.draining else None

    def drained_by(self, owner: DrainOwner) -> bool:
        """Drained with `owner`'s reason prefix: that owner (and only it) may resume it."""
        return self.draining and owner_of(self.reason) == owner

    @property
    def drained_by_us(self) -> bool:
        """Drained with healthd's reason prefix: healthd may resume it (never a straggler verdict's drain)."""
        return self.drained_by(HEALTHD)

    @property
    def drained_by_someone_else(self) -> bool:
        """Drained by an admin, another tool or another owner (a straggler verdict): never healthd's to resume."""
        return self.draining and not self.drained_by(HEALTHD)


class _Shape:
    """Where in an answer we are, to name the release, command and field of what does not fit."""

    def __init__(self, command: Sequence[str], release: str) -> None:
        self.command, self.release = list(command), release

    def error(self, path: str, what: str, *, unknown_shape: bool = True) -> SlurmVersionError:
        advice = ("; clusterctl does not know this output shape: please report it with the output attached"
                  if unknown_shape else "")
        return SlurmVersionError(self.command, f"Slurm {self.release}: field `{path}` {what}{advice}")

    def text(self, data: Mapping[str, Any], key: str, path: str, *, default: str | None = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.error(f"{path}.{key}", f"is {_kind(value)}, expected a string")
        return value

    def strings(self, value: object, path: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(path, f"is {_kind(value)}, expected a list of strings")
        return tuple(value)


def _kind(value: object) -> str:
    if value is None:
        return "missing"
    return f"{type(value).__name__} {json.dumps(value)[:40]}" if not isinstance(value, (dict, list)) \
        else ("an object" if isinstance(value, dict) else "a list")


def _release_of(data: Mapping[str, Any]) -> str:
    """The release an answer says it came from (`meta.slurm.release`, 22.05's and 23.02's `meta.Slurm.release`)."""
    meta = data.get("meta")
    if isinstance(meta, Mapping):
        for key in ("slurm", "Slurm"):
            about = meta.get(key)
            if isinstance(about, Mapping) and isinstance(about.get("release"), str):
                return str(about["release"])
    return "(release not stated)"


def _state(shape: _Shape, value: object, flags: object, path: str) -> tuple[str, tuple[str, ...]]:
    """(base state lower-cased, flags) from a 22.05 string + `state_flags` or a 23.02+ list."""
    if isinstance(value, str):
        if not value:
            raise shape.error(f"{path}.state", "is empty")
        found = shape.strings([] if flags is None else flags, f"{path}.state_flags")
        return value.lower(), found
    words = shape.strings(value, f"{path}.state")
    bases = [word for word in words if word in BASE_STATES]
    if len(bases) != 1:
        raise shape.error(f"{path}.state", f"is {list(words)}, expected exactly one base state "
                                           f"({', '.join(sorted(BASE_STATES))}) plus flags")
    return bases[0].lower(), tuple(word for word in words if word not in BASE_STATES)


def _flat_nodes(shape: _Shape, nodes: object) -> list[NodeState]:
    if not isinstance(nodes, list):
        raise shape.error("nodes", f"is {_kind(nodes)}, expected a list of nodes")
    found = []
    for i, node in enumerate(nodes):
        path = f"nodes[{i}]"
        if not isinstance(node, Mapping):
            raise shape.error(path, f"is {_kind(node)}, expected a node object")
        name = node.get("name") or node.get("hostname")
        if not isinstance(name, str) or not name:
            raise shape.error(f"{path}.name", f"is {_kind(name)}, expected the node's name")
        state, flags = _state(shape, node.get("state"), node.get("state_flags"), path)
        reason = shape.text(node, "reason", path, default="")
        partitions = shape.strings(node.get("partitions", []), f"{path}.partitions")
        found.append(NodeState(name, state, flags, reason, partitions))
    return found


def _group_names(shape: _Shape, nodes: object, path: str) -> tuple[str, ...]:
    if not isinstance(nodes, Mapping):
        raise shape.error(f"{path}.nodes", f"is {_kind(nodes)}, expected an object with `nodes`")
    names = nodes.get("nodes")
    if isinstance(names, str):  # a hostlist expression in some data_parser versions
        try:
            return tuple(hostlist.expand(names))
        except HostlistError as exc:
            raise shape.error(f"{path}.nodes.nodes", f"is not a hostlist ({exc})") from None
    return shape.strings(names, f"{path}.nodes.nodes")


def _grouped_nodes(shape: _Shape, groups: object) -> list[NodeState]:
    if not isinstance(groups, list):
        raise shape.error("sinfo", f"is {_kind(groups)}, expected a list of node groups")
    found = []
    for i, group in enumerate(groups):
        path = f"sinfo[{i}]"
        if not isinstance(group, Mapping) or not isinstance(group.get("node"), Mapping):
            raise shape.error(f"{path}.node", "is missing, expected an object with `state`")
        state, flags = _state(shape, group["node"].get("state"), None, f"{path}.node")
        names = _group_names(shape, group.get("nodes"), path)
        reason_field = group.get("reason", {})
        if isinstance(reason_field, Mapping):
            reason = shape.text(reason_field, "description", f"{path}.reason", default="")
        elif isinstance(reason_field, str):
            reason = reason_field
        else:
            raise shape.error(f"{path}.reason", f"is {_kind(reason_field)}, expected an object with `description`")
        partition = group.get("partition", {})
        if not isinstance(partition, Mapping):
            raise shape.error(f"{path}.partition", f"is {_kind(partition)}, expected an object with `name`")
        name = partition.get("name", "")
        partitions = (name,) if isinstance(name, str) and name else ()
        if len(names) > 1 and (reason or state == "down" or REASON_FLAGS & set(flags)):
            raise shape.error(f"{path}.reason", f"covers {len(names)} nodes ({hostlist.compress(list(names))}) "
                                                "but is only the first one's; ask one node per group "
                                                "(`sinfo --json -N`) or `scontrol show node --json`",
                                  unknown_shape=False)
        found += [NodeState(node, state, flags, reason, partitions) for node in names]
    return found


def parse_nodes_json(text: str, command: Sequence[str] = ("sinfo", "--json"),
                     release: SlurmVersion | None = None) -> list[NodeState]:
    """Every node in `sinfo --json` (22.05 flat, 23.02+ grouped) or `scontrol show node --json` output.

    A node listed twice (one group per partition) appears once, with every partition it is in.
    Raises SlurmVersionError naming the release, `command` and the field for any other shape.
    """
    shape = _Shape(command, str(release) if release else "(release not stated)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmVersionError(list(command), f"Slurm {shape.release}: the output is not JSON ({exc.msg}, "
                                               f"starting {text.strip()[:60]!r})") from None
    if not isinstance(data, Mapping):
        raise shape.error("(top)", f"is {_kind(data)}, expected an object with `nodes` or `sinfo`")
    if release is None:
        shape.release = _release_of(data)
    if "sinfo" in data:
        nodes = _grouped_nodes(shape, data["sinfo"])
    elif "nodes" in data:
        nodes = _flat_nodes(shape, data["nodes"])
    else:
        raise shape.error("nodes", "is missing (and so is `sinfo`), expected a list of nodes")
    merged: dict[str, NodeState] = {}
    for node in nodes:
        seen = merged.get(node.name)
        if seen is None:
            merged[node.name] = node
        else:
            extra = tuple(p for p in node.partitions if p not in seen.partitions)
            merged[node.name] = NodeState(seen.name, seen.state, seen.flags, seen.reason, seen.partitions + extra)
    return list(merged.values())


def parse_sinfo_json(text: str, command: Sequence[str] = ("sinfo", "--json"),
                     release: SlurmVersion | None = None) -> list[NodeState]:
    """Nodes from `sinfo --json` output of any release (see parse_nodes_json)."""
    return parse_nodes_json(text, command, release)


_STATE_MARKS = "*~#!%$@^-+"
"""Suffixes sinfo adds to a state word (`*` not responding, `~` powered off, `-` planned, ...)."""

_MARK_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWER_DOWN",
               "%": "POWERING_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
               "-": "PLANNED"}
"""What each sinfo suffix means, as the flag `--json` names it (sinfo(1), NODE STATE CODES)."""


def _sinfo_state(shape: _Shape, value: str, path: str) -> tuple[str, tuple[str, ...]]:
    """sinfo's long state (`drained`, `draining*`, `mixed+drain`) → (state lower-cased, flags).

    sinfo folds DRAIN into the state word (`drained`: idle and drained, `draining`: still
    running jobs); the DRAIN and FAIL flags are given back so NodeState reads the same as
    from JSON.
    """
    raw = [word.strip() for word in value.split("+")]
    words = [word.rstrip(_STATE_MARKS).lower() for word in raw]
    words = [word for word in words if word]
    if not words or not all(word.replace("_", "").isalpha() for word in words):
        raise shape.error(path, f"is {value!r}, expected a node state such as idle, drained or mixed")
    flags = tuple(flag for flag, spellings in (("DRAIN", ("drain", "drained", "draining")), ("FAIL", ("fail", "failing")))
                  if any(word in spellings for word in words))
    # The suffix is the only sign of a node that stopped answering pings (`down*`, `mixed*`):
    # dropping it would make a silent node read as healthy.
    marks = "".join(word[len(word.rstrip(_STATE_MARKS)):] for word in raw)
    flags += tuple(dict.fromkeys(_MARK_FLAGS[m] for m in marks if m in _MARK_FLAGS))
    return words[0], flags


def one_node_text_argv(node: str) -> list[str]:
    """`sinfo -h -n N -o %N|%T|%P|%E`: one single-node RPC (REQUEST_NODE_INFO_SINGLE) on every release,
    a line per partition of the node, the reason last (it may contain `|`).

    Measured at 12,500 nodes: `scontrol show node N` (text or --json) asks slurmctld for the
    whole table (REQUEST_NODE_INFO, 15-73 ms), as does 22.05's `sinfo --json -n N`; this is
    REQUEST_NODE_INFO_SINGLE (0.1-0.5 ms) on 22.05 and 26.05 alike.
    """
    return ["sinfo", "-h", "-n", node, "-o", "%N|%T|%P|%E"]


def parse_one_node_text(text: str, node: str, command: Sequence[str] | None = None,
                        release: SlurmVersion | None = None) -> NodeState:
    """Node `node` from `sinfo -h -n N -o %N|%T|%P|%E` output (one line per partition).

    Raises SlurmCommandError when sinfo does not list the node, SlurmVersionError naming the
    release, the command and the line for any other shape.
    """
    argv = list(command or one_node_text_argv(node))
    shape = _Shape(argv, str(release) if release else "(release not stated)")
    found: NodeState | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", 3)
        if len(parts) != 4:
            raise shape.error(f"line {number}", f"is {line[:60]!r}, expected NAME|STATE|PARTITION|REASON")
        name, state_text, partition, reason = (part.strip() for part in parts)
        if name != node:
            raise shape.error(f"line {number}", f"names {name[:40]!r}, expected {node!r}", unknown_shape=False)
        state, flags = _sinfo_state(shape, state_text, f"line {number}")
        partition = partition.rstrip("*")  # the default partition is marked with *
        reason = "" if reason == "none" else reason
        if found is None:
            found = NodeState(name, state, flags, reason, (partition,) if partition else ())
        elif partition and partition not in found.partitions:
            found = NodeState(found.name, found.state, found.flags, found.reason, found.partitions + (partition,))
    if found is None:
        raise SlurmCommandError(argv, 0, f"node {node} not known to Slurm")
    return found


@dataclass(frozen=True)
class PartitionShare:
    """How many nodes a partition has, and how many of them are drained with one owner's reason
    (healthd's unless said otherwise: each owner's share cap counts its own drains only)."""

    partition: str
    nodes: int
    drained_by_us: int

    @classmethod
    def of(cls, partition: str, nodes: Sequence[NodeState], owner: DrainOwner = HEALTHD) -> PartitionShare:
        """The share of a list of nodes (e.g. parse_nodes_json's), those in `partition` only."""
        mine = [node for node in nodes if partition in node.partitions]
        return cls(partition, len(mine), sum(node.drained_by(owner) for node in mine))


def partition_share_argv(partition: str) -> list[str]:
    """One sinfo of a partition, grouped by state and reason: a few lines whatever the partition's size."""
    return ["sinfo", "-h", "-p", partition, "-o", "%D|%T|%E"]


def parse_partition_share(text: str, partition: str, command: Sequence[str] | None = None,
                          release: SlurmVersion | None = None, owner: DrainOwner = HEALTHD) -> PartitionShare:
    """`sinfo -h -p P -o %D|%T|%E` → the partition's size and its nodes drained by `owner` (healthd).

    Each line is a count, a state (`drained`, `draining`, `drain`, `idle*`, ...) and the reason
    its nodes share (the reason comes last: it may itself contain `|`).
    """
    argv = list(command or partition_share_argv(partition))
    shape = _Shape(argv, str(release) if release else "(release not stated)")
    nodes = ours = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        count, sep, rest = line.partition("|")
        state, sep2, reason = rest.partition("|")
        if not (sep and sep2 and count.strip().isascii() and count.strip().isdigit()):
            raise shape.error(f"line {number}", f"is {line[:60]!r}, expected COUNT|STATE|REASON")
        nodes += int(count)
        if state.strip().rstrip(_STATE_MARKS).lower() in ("drain", "drained", "draining") \
                and owner_of(reason.strip()) == owner:
            ours += int(count)
    return PartitionShare(partition, nodes, ours)


def parse_partition_size(text: str, partition: str, command: Sequence[str] | None = None,
                         release: SlurmVersion | None = None) -> int:
    """`scontrol show partition P` → its TotalNodes (a cheap REQUEST_PARTITION_INFO on every release)."""
    argv = list(command or ["scontrol", "show", "partition", partition])
    shape = _Shape(argv, str(release) if release else "(release not stated)")
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "TotalNodes":
            if not (value.isascii() and value.isdigit()):
                raise shape.error("TotalNodes", f"is {value[:20]!r}, expected a number of nodes")
            return int(value)
    raise shape.error("TotalNodes", "is missing (is this `scontrol show partition` output?)")


def all_nodes_argv(release: SlurmVersion) -> list[str]:
    """The command that shows every node with its own reason on this release."""
    return ["scontrol", "show", "node", "--json"] if release.scontrol_node_json else ["sinfo", "--json"]


class NodeSlurm(Protocol):
    """One node's Slurm as healthd's daemon, its applier and breaker, and its hooks (prolog, epilog,
    HealthCheckProgram) ask it: `SlurmNode` is the real one, tests/fakes.py's `FakePartition` gives
    the tests' one.  The drain door itself asks only part of it (`drains.NodeDoor`)."""

    def state(self) -> NodeState: ...

    def drain(self, reason: str) -> None: ...

    def resume(self) -> None: ...

    def partition_share(self, partition: str, owner: DrainOwner = ...) -> PartitionShare: ...

    def partition_size(self, partition: str) -> int: ...

    def jobs_here(self) -> tuple[str, ...]: ...


class SlurmNode:
    """The Slurm operations healthd performs for one node.

    `release`: the Slurm release, when the caller already knows it; otherwise asked once per
    process on first need (`sbatch --version`, answered by the client alone).  What healthd and
    the hooks call (state, partition_share, partition_size, drain, resume) is the same on every
    release and never needs it.
    """

    def __init__(self, node: str, runner: Runner = subprocess_runner, timeout: float = 10.0, *,
                 release: SlurmVersion | None = None) -> None:
        self.node, self.runner, self.timeout = node, runner, timeout
        self._known_release = release

    def _run(self, argv: list[str]) -> str:
        return run_checked(self.runner, argv, self.timeout)

    def release(self) -> SlurmVersion:
        """The Slurm release this node's commands belong to."""
        if self._known_release is None:
            self._known_release = ask_version(self.runner, self.timeout)
        return self._known_release

    def state(self) -> NodeState:
        """This node's state; SlurmCommandError when Slurm does not know it."""
        argv = one_node_text_argv(self.node)  # the same on every release: no `sbatch --version` first
        return parse_one_node_text(self._run(argv), self.node, argv, self._known_release)

    def partition_nodes(self, partition: str) -> list[NodeState]:
        """Every node of a partition, each with its own reason (filtered here: 22.05 ignores `-p`).

        The whole table as JSON (15 MB at 12,500 nodes): healthd's breaker uses partition_share.
        """
        release = self.release()
        argv = all_nodes_argv(release)
        return [node for node in parse_nodes_json(self._run(argv), argv, release) if partition in node.partitions]

    def partition_share(self, partition: str, owner: DrainOwner = HEALTHD) -> PartitionShare:
        """The partition's size and its nodes drained by `owner` (healthd): one whole-table RPC, a few lines of text."""
        argv = partition_share_argv(partition)
        return parse_partition_share(self._run(argv), partition, argv, self._known_release, owner)

    def partition_size(self, partition: str) -> int:
        """How many nodes the partition has (REQUEST_PARTITION_INFO: no node is read)."""
        argv = ["scontrol", "show", "partition", partition]
        return parse_partition_size(self._run(argv), partition, argv, self._known_release)

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
