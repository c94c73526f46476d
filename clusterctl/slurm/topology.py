"""The network tree a job's nodes hang in, from any of Slurm's three views of it.

* topology.conf (`SwitchName=leaf1 Nodes=node[1-2]`, `SwitchName=spine Switches=leaf[1-2]`),
* the output of `scontrol show topology` (the same lines with `Level=`; upper levels list
  every node below them, so only switches without `Switches=` place nodes),
* per-node `SLURM_TOPOLOGY_ADDR` paths (`spine.leaf1.node1`, optionally `node1 spine.leaf1.node1`).

Block topologies (topology/block, Slurm 23.11+) read as the same tree: each base block is a
leaf, each aggregated block the unit above the blocks it contains.  From topology.conf
(`BlockName=b1 Nodes=node[1-2]`, `BlockSizes=2,4`) and from `scontrol show topology`
(`BlockName=b1 BlockIndex=0 Nodes=node[1-2]`; 24.11 adds ` BlockSize=2` and
`AggregatedBlock=b[1-2] BlockIndex=2 Nodes=node[1-4] BlockSize=4` lines).  topology.yaml
(25.05+) is read through `scontrol show topology`, which prints whichever file defines it.

All give the same `Topology`.  NVLink domains larger than one node (an NVL72 rack)
come from a small TOML file of ours; without one, each node is its own NVLink domain.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.errors import HostlistError, TopologyError
from clusterctl.slurm import hostlist

TOP = "(top)"
"""The unit above every root switch: crossing it means leaving the whole tree."""

_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only ('²'.isdigit() is True, int('²') fails), no huge values

MAX_SWITCH_LEVELS = 64
"""Deeper switch chains are refused: real fabrics have a handful of levels, and the planner walks each."""


@dataclass(frozen=True)
class Topology:
    """Switch tree plus node placement; `levels()` gives each node's unit at every level.

    Level 0 is the NVLink domain (the node itself unless declared), level 1 the leaf switch,
    level 2 the leaf's parent, and so on up to a single top unit.
    """

    parent: dict[str, str | None]
    leaf_of: dict[str, str]
    nvlink_domain: dict[str, str] = field(default_factory=dict)
    source: str = ""
    kind: str = "tree"
    """"tree" (switches) or "block" (topology/block: leaves are base blocks)."""
    block_size: int | None = None
    """For a block topology, the nodes of one base block (Slurm's bblock_node_cnt): no
    `--segment` may be larger."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_units", {})  # node -> its unit at every level (a cache, not state)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.leaf_of)

    def units(self, node: str) -> tuple[str, ...]:
        """The node's unit at every level 0..depth (cached: the tree does not change)."""
        cache: dict[str, tuple[str, ...]] = self._units  # type: ignore[attr-defined]
        found = cache.get(node)
        if found is None:
            found = cache[node] = tuple(self.unit(node, level) for level in range(self.depth() + 1))
        return found

    def depth(self) -> int:
        """Number of switch levels (1 for a single leaf, 2 for leaves under one spine...)."""
        cached = self.__dict__.get("_depth")
        if cached is None:
            cached = max((len(self.switch_path(n)) for n in self.leaf_of), default=0)
            object.__setattr__(self, "_depth", cached)
        return cached

    def switch_path(self, node: str) -> list[str]:
        """Switches from the node's leaf up to its root."""
        path = [self.leaf_of[node]]
        while (up := self.parent.get(path[-1])) is not None:
            path.append(up)
        return path

    def domain(self, node: str) -> str:
        return self.nvlink_domain.get(node, node)

    def unit(self, node: str, level: int) -> str:
        """The node's unit at `level` (0 NVLink domain, 1 leaf, ...); TOP above the roots."""
        if level == 0:
            return self.domain(node)
        path = self.switch_path(node)
        return path[level - 1] if level - 1 < len(path) else TOP

    def level_names(self) -> list[str]:
        """Names of levels 0..depth: nvlink, leaf, agg (or agg2, agg3...), spine (the roots);
        for a block topology nvlink, block, then aggregated blocks (agg-block, agg-block2...)."""
        depth = self.depth()
        if self.kind == "block":
            upper = ["agg-block" if level == 2 else f"agg-block{level - 1}" for level in range(2, depth + 1)]
            return ["nvlink", "block", *upper][: depth + 1]
        names = ["nvlink", "leaf"][: depth + 1]
        middle = range(2, depth)
        names += ["agg" if len(middle) == 1 else f"agg{level}" for level in middle]
        names += ["spine"] if depth >= 2 else []
        return names

    def dfs_order(self, nodes: Iterable[str] | None = None) -> list[str]:
        """Nodes in depth-first order of the tree (switches and nodes in declaration order)."""
        wanted = set(self.leaf_of if nodes is None else nodes)
        children: dict[str | None, list[str]] = {}
        for switch, up in self.parent.items():
            children.setdefault(up, []).append(switch)
        under: dict[str, list[str]] = {}
        for node, leaf in self.leaf_of.items():
            under.setdefault(leaf, []).append(node)
        order: list[str] = []
        # Iterative depth-first walk: a chain of thousands of switches must not hit Python's recursion limit.
        stack = list(reversed(children.get(None, [])))
        while stack:
            switch = stack.pop()
            order.extend(n for n in under.get(switch, []) if n in wanted)
            stack.extend(reversed(children.get(switch, [])))
        return order

    def with_nvlink_domains(self, domains: dict[str, str]) -> Topology:
        unknown = sorted(set(domains) - set(self.leaf_of))
        if unknown:
            raise TopologyError(f"NVLink domains name nodes that are not in the topology: "
                                f"{hostlist.compress(unknown)}", source=self.source)
        return Topology(self.parent, self.leaf_of, dict(domains), self.source, self.kind, self.block_size)


# ---- parsing -------------------------------------------------------------------------
@dataclass
class _Switch:
    name: str
    line: int
    nodes: list[str] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)
    has_switches: bool = False


def _expand(expression: str, source: str, line: int, what: str) -> list[str]:
    try:
        return hostlist.expand(expression)
    except HostlistError as exc:
        raise TopologyError(f"{what}: {exc}", source=source, line=line) from None


def _parse_switch_lines(text: str, source: str, *, aggregated: bool) -> list[_Switch]:
    switches: list[_Switch] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep or not key:
                raise TopologyError(f"expected Key=Value, found {token!r}", source=source, line=number)
            fields[key.lower()] = value
        unknown = set(fields) - {"switchname", "switches", "nodes", "linkspeed", "level"}
        if unknown:
            raise TopologyError(f"unknown key {sorted(unknown)[0]!r} (known: SwitchName, Switches, Nodes, "
                                "LinkSpeed)", source=source, line=number)
        if "switchname" not in fields or not fields["switchname"]:
            raise TopologyError("every line needs SwitchName=", source=source, line=number)
        switch = _Switch(fields["switchname"], number)
        if "switches" in fields:
            switch.switches = _expand(fields["switches"], source, number, "Switches")
            switch.has_switches = True
        if "nodes" in fields and not (aggregated and switch.has_switches):
            # `scontrol show topology` lists every node below an upper switch; only leaves place nodes.
            switch.nodes = _expand(fields["nodes"], source, number, "Nodes")
        switches.append(switch)
    return switches


def _build(switches: Sequence[_Switch], source: str) -> Topology:
    by_name: dict[str, _Switch] = {}
    for switch in switches:
        if switch.name in by_name:
            raise TopologyError(f"switch {switch.name!r} is defined twice (first on line "
                                f"{by_name[switch.name].line})", source=source, line=switch.line)
        by_name[switch.name] = switch
    parent: dict[str, str | None] = {name: None for name in by_name}
    for switch in switches:
        for child in switch.switches:
            if child not in by_name:
                raise TopologyError(f"switch {switch.name!r} lists unknown switch {child!r}; define it with "
                                    f"its own SwitchName= line", source=source, line=switch.line)
            if parent[child] is not None:
                raise TopologyError(f"switch {child!r} is under both {parent[child]!r} and {switch.name!r}",
                                    source=source, line=switch.line)
            parent[child] = switch.name
    for name in by_name:
        seen = {name}
        up = parent[name]
        while up is not None:
            if up in seen:
                raise TopologyError(f"switches form a cycle through {name!r}", source=source,
                                    line=by_name[name].line)
            seen.add(up)
            if len(seen) > MAX_SWITCH_LEVELS:
                raise TopologyError(f"switch {name!r} is more than {MAX_SWITCH_LEVELS} levels below its root; "
                                    "a network tree has a few levels (leaf, spine, core)", source=source,
                                    line=by_name[name].line)
            up = parent[up]
    leaf_of: dict[str, str] = {}
    for switch in switches:
        for node in switch.nodes:
            if node in leaf_of:
                raise TopologyError(f"node {node!r} is under two leaf switches, {leaf_of[node]!r} and "
                                    f"{switch.name!r}", source=source, line=switch.line)
            leaf_of[node] = switch.name
    if not leaf_of:
        raise TopologyError("no switch lists any node (Nodes=)", source=source)
    return Topology(parent, leaf_of, {}, source)


BLOCK_KEYS = frozenset({"blockname", "aggregatedblock", "blocksizes"})
"""First keys of a topology/block line (topology.conf or `scontrol show topology`)."""


@dataclass
class _Block:
    name: str
    line: int
    nodes: list[str]
    aggregated: bool
    size: int | None


def _is_block(text: str) -> bool:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            return line.split("=", 1)[0].strip().lower() in BLOCK_KEYS
    return False


def _parse_block_lines(text: str, source: str) -> tuple[list[_Block], list[int]]:
    """Blocks in order, and BlockSizes= (topology.conf) if given."""
    blocks: list[_Block] = []
    sizes: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        first = ""
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep or not key:
                raise TopologyError(f"expected Key=Value, found {token!r}", source=source, line=number)
            first = first or key.lower()
            fields[key.lower()] = value
        unknown = set(fields) - {"blockname", "aggregatedblock", "blockindex", "nodes", "blocksize", "blocksizes"}
        if unknown:
            raise TopologyError(f"unknown key {sorted(unknown)[0]!r} in a block topology (known: BlockName, "
                                "AggregatedBlock, BlockIndex, Nodes, BlockSize, BlockSizes)", source=source, line=number)
        if first == "blocksizes":
            parts = fields["blocksizes"].split(",")
            sizes = [int(size) for size in parts] if all(_COUNT.fullmatch(size) for size in parts) else []
            if not sizes or any(size <= 0 for size in sizes):
                raise TopologyError(f"BlockSizes={fields['blocksizes']!r}: expected positive numbers, e.g. 2,4",
                                    source=source, line=number)
            continue
        if first not in ("blockname", "aggregatedblock") or not fields[first]:
            raise TopologyError("every block line starts with BlockName= or AggregatedBlock=", source=source,
                                line=number)
        size = fields.get("blocksize")
        if size is not None and not _COUNT.fullmatch(size):
            raise TopologyError(f"BlockSize={size!r} is not a number", source=source, line=number)
        nodes = _expand(fields["nodes"], source, number, "Nodes") if fields.get("nodes") else []
        blocks.append(_Block(fields[first], number, nodes, first == "aggregatedblock",
                             int(size) if size is not None else None))
    return blocks, sizes


def _aggregate_by_sizes(blocks: list[_Block], sizes: list[int], base: int) -> list[_Block]:
    """topology.conf's BlockSizes: each larger size groups that many nodes' worth of consecutive base blocks."""
    out: list[_Block] = []
    for size in sizes[1:]:
        per = size // base
        if per < 2 or size % base:
            continue
        for start in range(0, len(blocks) - per + 1, per):
            group = blocks[start:start + per]
            out.append(_Block(hostlist.compress([b.name for b in group]), group[0].line,
                              [n for b in group for n in b.nodes], True, size))
    return out


def _build_blocks(blocks: list[_Block], sizes: list[int], source: str) -> Topology:
    base = [b for b in blocks if not b.aggregated and b.nodes]
    if not base:
        raise TopologyError("no BlockName= line lists any node (Nodes=)", source=source)
    # Slurm's base block size: BlockSizes' first, else what the lines say, else the first block's nodes.
    printed = [b.size for b in base if b.size]
    block_size = sizes[0] if sizes else min(printed) if printed else len(base[0].nodes)
    upper = [b for b in blocks if b.aggregated and b.nodes] or _aggregate_by_sizes(base, sizes, block_size)
    leaf_of: dict[str, str] = {}
    parent: dict[str, str | None] = {}
    members: dict[str, frozenset[str]] = {}
    for block in base:
        if block.name in parent:
            raise TopologyError(f"block {block.name!r} is defined twice", source=source, line=block.line)
        parent[block.name] = None
        members[block.name] = frozenset(block.nodes)
        for node in block.nodes:
            if node in leaf_of:
                raise TopologyError(f"node {node!r} is in two blocks, {leaf_of[node]!r} and {block.name!r}",
                                    source=source, line=block.line)
            leaf_of[node] = block.name
    for block in sorted(upper, key=lambda b: len(b.nodes)):
        name = block.name if block.name not in parent else f"{block.name}@{len(block.nodes)}"
        nodes = frozenset(block.nodes)
        unknown = sorted(nodes - set(leaf_of))
        if unknown:
            raise TopologyError(f"aggregated block {block.name!r} lists nodes in no block: "
                                f"{hostlist.compress(unknown)}", source=source, line=block.line)
        children = [unit for unit, up in parent.items() if up is None and members[unit] <= nodes]
        parent[name] = None
        members[name] = nodes
        for child in children:
            parent[child] = name
    return Topology(parent, leaf_of, {}, source, "block", block_size)


def parse_topology_conf(text: str, source: str = "topology.conf") -> Topology:
    """Read Slurm's topology.conf (topology/tree switches or topology/block blocks)."""
    if _is_block(text):
        return _build_blocks(*_parse_block_lines(text, source), source)
    return _build(_parse_switch_lines(text, source, aggregated=False), source)


def parse_scontrol_topology(text: str, source: str = "scontrol show topology") -> Topology:
    """Read the output of `scontrol show topology` (tree switches or blocks)."""
    if _is_block(text):
        return _build_blocks(*_parse_block_lines(text, source), source)
    return _build(_parse_switch_lines(text, source, aggregated=True), source)


def parse_topology_addrs(text: str, source: str = "SLURM_TOPOLOGY_ADDR") -> Topology:
    """Read `SLURM_TOPOLOGY_ADDR` paths, one per line: `spine.leaf1.node1` or `node1 spine.leaf1.node1`."""
    switches: dict[str, _Switch] = {}
    child_seen: set[tuple[str, str]] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise TopologyError(f"expected 'PATH' or 'NODE PATH', found {raw.strip()!r}", source=source, line=number)
        parts = words[-1].split(".")
        if len(parts) < 2 or not all(parts):
            raise TopologyError(f"path {words[-1]!r} needs at least a switch and a node (e.g. leaf1.node1)",
                                source=source, line=number)
        if len(words) == 2 and words[0] != parts[-1]:
            raise TopologyError(f"node {words[0]!r} does not match its path's last part {parts[-1]!r}",
                                source=source, line=number)
        names = []
        for part in parts:
            expanded = _expand(part, source, number, "path")
            if len(expanded) != 1:
                raise TopologyError(f"path part {part!r} names {len(expanded)} switches; a tree needs one",
                                    source=source, line=number)
            names.append(expanded[0])
        *path, node = names
        for i, name in enumerate(path):
            switch = switches.setdefault(name, _Switch(name, number))
            if i + 1 < len(path) and (name, path[i + 1]) not in child_seen:
                child_seen.add((name, path[i + 1]))
                switch.switches.append(path[i + 1])
        switches[path[-1]].nodes.append(node)
    return _build(list(switches.values()), source)


def parse_topology(text: str, source: str) -> Topology:
    """Any of the three formats, recognised by content."""
    meaningful = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    meaningful = [line for line in meaningful if line]
    if _is_block(text):
        return parse_topology_conf(text, source)
    if any("level=" in line.lower() for line in meaningful):
        return parse_scontrol_topology(text, source)
    if meaningful and all("=" not in line for line in meaningful):
        return parse_topology_addrs(text, source)
    return parse_topology_conf(text, source)


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text (byte {exc.start + 1}); {what} is a text file", source=str(path)) from None


def load_topology(path: Path) -> Topology:
    """Read a topology file of any supported format (TopologyError when it cannot be read)."""
    return parse_topology(_read_text(path, "a topology file"), str(path))


def load_nvlink_domains(path: Path) -> dict[str, str]:
    """Read our NVLink-domain file: `[[domain]]` tables with `name` and `nodes` (a hostlist)."""
    text = _read_text(path, "an NVLink-domain file (TOML)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"not valid TOML: {exc}", source=str(path)) from None
    except RecursionError:
        raise TopologyError("not valid TOML: nested too deeply", source=str(path)) from None
    domains = data.get("domain")
    if not isinstance(domains, list) or not domains:
        raise TopologyError("expected one or more [[domain]] tables with name = \"...\" and nodes = \"...\"",
                            source=str(path))
    out: dict[str, str] = {}
    for i, entry in enumerate(domains, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                or not isinstance(entry.get("nodes"), str):
            raise TopologyError(f"[[domain]] number {i} needs string keys `name` and `nodes`", source=str(path))
        try:
            nodes = hostlist.expand(entry["nodes"])
        except HostlistError as exc:
            raise TopologyError(f"[[domain]] {entry['name']!r}, key `nodes`: {exc}", source=str(path)) from None
        for node in nodes:
            if node in out:
                raise TopologyError(f"node {node!r} is in two NVLink domains, {out[node]!r} and {entry['name']!r}",
                                    source=str(path))
            out[node] = entry["name"]
    return out
