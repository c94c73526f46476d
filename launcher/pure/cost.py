"""What a rank map costs the network, per group kind and tree level.

Placement only decides which physical node fills each logical node slot (rank r runs on
slot r // gpus_per_node, GPU r % gpus_per_node), so groups are judged by the slots they
touch: for each kind (TP, CP, EP, DP, PP) and level (NVLink domain, leaf, spine...):
how many groups span more than one unit, the sum of (span - 1), the largest span, and
the edges between consecutive ranks of the group that cross units (closing the ring for
collectives, as NCCL's rings do; a pipeline's stages form a chain).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import ne

from clusterctl.launcher.pure.parallel import DIMS, ParallelLayout
from clusterctl.slurm.topology import Topology

DEFAULT_WEIGHTS: Mapping[str, float] = {"tp": 8.0, "cp": 4.0, "ep": 2.0, "dp": 1.0, "pp": 1.0}
"""Relative traffic of each group kind; tunable (`--weight dp=2`)."""


@dataclass(frozen=True)
class SlotGroups:
    """The groups of one kind, reduced to the slots they touch (with how many groups share each)."""

    kind: str
    slot_sets: tuple[tuple[int, ...], ...]
    multiplicity: tuple[int, ...]
    ring_slots: tuple[tuple[int, ...], ...]
    """Per distinct group: slot of each rank in ring order (for crossing edges)."""
    ring_multiplicity: tuple[int, ...]


def slot_groups(layout: ParallelLayout, gpus_per_node: int) -> dict[str, SlotGroups]:
    """Every kind with size > 1, its groups reduced to slot sets (deduplicated, counted)."""
    out: dict[str, SlotGroups] = {}
    # Rank -> slot as a lookup whose entries share one int per slot: a 100,000-GPU job's groups
    # then hold references, not millions of separate numbers.
    slot_of = [slot for slot in range(-(-layout.world_size // gpus_per_node)) for _ in range(gpus_per_node)]
    for kind in DIMS:
        if layout.size(kind) <= 1:
            continue
        sets: dict[tuple[int, ...], int] = {}
        rings: dict[tuple[int, ...], int] = {}
        for group in layout.iter_groups(kind):
            ring = tuple(map(slot_of.__getitem__, group))
            rings[ring] = rings.get(ring, 0) + 1
            key = tuple(sorted(set(ring)))
            sets[key] = sets.get(key, 0) + 1
        out[kind] = SlotGroups(kind, tuple(sets), tuple(sets.values()), tuple(rings), tuple(rings.values()))
    return out


@dataclass(frozen=True)
class LevelCost:
    """One group kind at one tree level."""

    groups: int
    spanning: int
    span_excess: int
    max_span: int
    crossing_edges: int


@dataclass(frozen=True)
class CostReport:
    """Costs of a slot → node assignment: `table[kind][level] -> LevelCost`, plus the scalar objective."""

    levels: tuple[str, ...]
    table: dict[str, dict[str, LevelCost]]
    objective: float

    def leaf_crossing_groups(self, kinds: Sequence[str] = ("dp", "pp")) -> int:
        """Groups of the given kinds that span more than one leaf switch."""
        return sum(self.table[k]["leaf"].spanning for k in kinds if k in self.table and "leaf" in self.table[k])


def unit_ids(topology: Topology, nodes: Sequence[str]) -> list[list[int]]:
    """Per level (0 = NVLink domain, 1 = leaf, ...), an integer unit id for each node."""
    per_node = [topology.units(n) for n in nodes]
    levels = []
    for level in range(topology.depth() + 1):
        names: dict[str, int] = {}
        levels.append([names.setdefault(units[level], len(names)) for units in per_node])
    return levels


SPAN_EXCESS_WEIGHT = 0.25
"""Weight of each extra unit a group spans, next to the 1 it costs to span more than one at all."""


def group_penalty(span: int) -> float:
    """What one group spanning `span` units at a level adds to the objective.

    Crossing a level at all is what hurts most (one uplink in a ring slows the whole ring),
    so a spanning group costs 1, plus a little for each further unit it touches.
    """
    return (1.0 if span > 1 else 0.0) + SPAN_EXCESS_WEIGHT * (span - 1)


def level_weight(level: int) -> float:
    """Crossing a higher level costs more (more oversubscribed): 1 for a leaf, 2 above it, 4..."""
    return 0.0 if level == 0 else float(2 ** (level - 1))


def evaluate(groups: Mapping[str, SlotGroups], slot_units: Sequence[Sequence[int]], level_names: Sequence[str],
             weights: Mapping[str, float] = DEFAULT_WEIGHTS) -> CostReport:
    """Cost of an assignment given each slot's unit id per level (`slot_units[level][slot]`)."""
    table: dict[str, dict[str, LevelCost]] = {}
    objective = 0.0
    for kind, g in groups.items():
        table[kind] = {}
        # A group inside one slot spans one unit and crosses nothing at every level (TP inside a
        # node: 100,000 groups in a 100,000-node job), so only groups over several slots are looked at.
        sets = [(slots, count) for slots, count in zip(g.slot_sets, g.multiplicity) if len(slots) > 1]
        rings = [(ring, count) for ring, count in zip(g.ring_slots, g.ring_multiplicity) if len(set(ring)) > 1]
        for level, units in enumerate(slot_units):
            unit_of = units.__getitem__
            spans = [len(set(map(unit_of, slots))) for slots, _ in sets]
            spanning = sum(count for span, (_, count) in zip(spans, sets) if span > 1)
            excess = sum((span - 1) * count for span, (_, count) in zip(spans, sets))
            crossing = 0
            for ring, count in rings:
                ring_units = list(map(unit_of, ring))
                # Collectives run as rings (the last rank talks to the first); a pipeline is a chain.
                following = ring_units[1:] + (ring_units[:1] if kind != "pp" and len(ring) > 2 else [])
                crossing += count * sum(map(ne, ring_units, following))
            table[kind][level_names[level]] = LevelCost(sum(g.multiplicity), spanning, excess, max(spans, default=1),
                                                        crossing)
            if level:
                objective += weights.get(kind, 1.0) * level_weight(level) * sum(
                    group_penalty(span) * count for span, (_, count) in zip(spans, sets))
    return CostReport(tuple(level_names), table, objective)
