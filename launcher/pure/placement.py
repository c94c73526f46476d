"""Choose which physical node fills each logical node slot of a job (tile, pack, polish).

Frameworks fix which ranks form groups, so the one free variable is the slot → node
permutation (local GPU order stays identical on every node).  The planner:

1. **packs**: picks the nodes to use when there are more than needed, best-fit down the
   tree (the fewest, fullest leaves), as blocks of nodes sharing an NVLink domain when TP
   spans nodes;
2. **tiles**: orders the logical slots so that each leaf receives a compact block of the
   slot grid whose aspect follows the traffic weights (a/b ≈ w_dp/w_pp), trying several
   tile shapes and both baselines, and keeps the cheapest;
3. **polishes**: pairwise swaps across leaves that lower the objective (deterministic;
   exhaustive on small jobs, a bounded number of tries on large ones).

Both baselines — Slurm's hostname order and the topology's depth-first order — are
candidates, so the result never costs more than either.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from operator import itemgetter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from clusterctl.errors import PlacementError
from clusterctl.launcher.pure.cost import (
    DEFAULT_WEIGHTS, CostReport, SlotGroups, evaluate, group_penalty, level_weight, slot_groups,
)
from clusterctl.launcher.pure.parallel import ParallelLayout, validate_for_cluster
from clusterctl.records.rank_map import RankMap, PlanSummary
from clusterctl.slurm import hostlist
from clusterctl.slurm.topology import TOP, Topology


@dataclass(frozen=True)
class Plan:
    """A chosen rank map for `layout`, its cost, the baselines' costs and why it was chosen."""

    layout: ParallelLayout
    rank_map: RankMap
    cost: CostReport
    baselines: dict[str, CostReport]
    strategy: str
    explanation: tuple[str, ...]

    def slot_coordinates(self, slot: int) -> dict[str, int]:
        """cp/dp/pp indices of a slot's first rank: the dimensions that vary across slots (size > 1)."""
        coords = self.layout.coordinates(self.rank_map.first_rank(slot))
        return {d: v for d, v in coords.items() if d in ("cp", "dp", "pp") and self.layout.size(d) > 1}

    def summary(self) -> PlanSummary:
        """Strategy and leaf-crossing DP/PP groups against Slurm's and the depth-first order."""
        return PlanSummary(self.strategy, self.cost.leaf_crossing_groups(),
                           self.baselines["slurm"].leaf_crossing_groups(), self.baselines["dfs"].leaf_crossing_groups())


@dataclass(frozen=True, eq=False)
class PlannedMap:
    """A plan and what it was planned from (layout, GPUs a node, topology, nodes in the order given, weights),
    so a later step asking for the same map takes it instead of planning it again: a shrink's map is planned
    by the recovery judge and written by the step it starts (3.2 s each at 12,512 nodes)."""

    layout: ParallelLayout
    gpus_per_node: int
    topology: Topology
    nodes: tuple[str, ...]
    weights: tuple[tuple[str, float], ...]
    plan: Plan

    def answers(self, layout: ParallelLayout, gpus_per_node: int, topology: Topology, nodes: Sequence[str],
                weights: Mapping[str, float]) -> bool:
        """The plan is the one `plan` gives for these inputs (the planner is deterministic)."""
        return (self.layout == layout and self.gpus_per_node == gpus_per_node and self.nodes == tuple(nodes)
                and dict(self.weights) == dict(weights) and (self.topology is topology or self.topology == topology))


def plan_once(layout: ParallelLayout, gpus_per_node: int, topology: Topology, allocated: Sequence[str],
              weights: Mapping[str, float] = DEFAULT_WEIGHTS, planned: PlannedMap | None = None) -> PlannedMap:
    """`plan` of these inputs with them; `planned` itself when it was planned from the same inputs."""
    if planned is not None and planned.answers(layout, gpus_per_node, topology, allocated, weights):
        return planned
    return PlannedMap(layout, gpus_per_node, topology, tuple(allocated), tuple(weights.items()),
                      plan(layout, gpus_per_node, topology, allocated, weights))


def natural_key(name: str) -> tuple[str, int, int]:
    """Sort key putting node2 before node10, as Slurm lists a job's nodes."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    return (stem, int(digits) if digits else -1, len(digits))


def slurm_order(nodes: Sequence[str]) -> list[str]:
    """Slurm's order for a job's nodes (SLURM_JOB_NODELIST): by name, numbers numerically."""
    return sorted(nodes, key=natural_key)


def plan(layout: ParallelLayout, gpus_per_node: int, topology: Topology, allocated: Sequence[str],
         weights: Mapping[str, float] = DEFAULT_WEIGHTS, *, polish_tries: int | None = None) -> Plan:
    """Plan the rank map of `layout` on `allocated` nodes (any subset of the topology's nodes)."""
    _check_nodes(topology, allocated)
    slots_needed = layout.world_size // gpus_per_node if layout.world_size % gpus_per_node == 0 else -1
    domain_nodes = _nodes_per_domain(topology, allocated)
    if slots_needed < 0 or len(allocated) < slots_needed:
        validate_for_cluster(layout, nodes=max(len(allocated), 1), gpus_per_node=gpus_per_node,
                             nodes_per_nvlink_domain=domain_nodes)
    validate_for_cluster(layout, nodes=slots_needed, gpus_per_node=gpus_per_node,
                         nodes_per_nvlink_domain=domain_nodes)
    block = max(1, layout.nvlink_size() // gpus_per_node)  # nodes per NVLink-bound block
    groups = slot_groups(layout, gpus_per_node)
    levels = topology.level_names()
    unit_numbers = _unit_numbers(_node_units(topology, allocated))

    def report(slots: Sequence[str]) -> CostReport:
        # evaluate() only compares units, so numbers shared by the whole allocation serve every order.
        return evaluate(groups, [list(level) for level in zip(*map(unit_numbers.__getitem__, slots))], levels,
                        weights)

    dfs_nodes = topology.dfs_order(allocated)[:slots_needed]
    slurm_nodes = slurm_order(allocated)[:slots_needed]
    baselines = {"slurm": report(slurm_nodes), "dfs": report(dfs_nodes)}

    blocks_needed = slots_needed // block
    every_block = _domain_blocks(topology, allocated, block, blocks_needed)
    physical = _best_fit(topology, every_block, blocks_needed)
    optimiser = _Optimiser(layout, gpus_per_node, block, groups, topology, weights, unit_numbers)
    best: tuple[float, str, list[list[str]]] | None = None
    for name, assignment in _candidates(topology, optimiser, physical, every_block, blocks_needed,
                                        [[n] for n in slurm_nodes] if block == 1 else None,
                                        [[n] for n in dfs_nodes] if block == 1 else None):
        score = optimiser.objective(assignment)
        if best is None or score < best[0]:  # the first of equally good candidates wins
            best = (score, name, assignment)
    assert best is not None, "the depth-first order of best-fit nodes is always a candidate"
    best_score, strategy, assignment = best
    in_use = {id(b) for b in assignment}
    used_nodes = {n for b in assignment for n in b}
    spares = [b for b in every_block if not used_nodes & set(b) and id(b) not in in_use]
    assignment, swaps, polished = optimiser.polish(list(assignment), spares, best_score, polish_tries)
    slots = tuple(node for blk in assignment for node in blk)
    rank_map = RankMap(slots, gpus_per_node)
    explanation = _explain(optimiser, topology, assignment, strategy, best_score, polished, swaps, len(allocated),
                           slots_needed)
    return Plan(layout, rank_map, report(slots), baselines, strategy + (f" + {swaps} swaps" if swaps else ""), explanation)


def _candidates(topology: Topology, optimiser: _Optimiser, physical: list[list[str]], every_block: list[list[str]],
                blocks_needed: int, slurm_blocks: list[list[str]] | None, dfs_blocks: list[list[str]] | None,
                ) -> Iterator[tuple[str, list[list[str]]]]:
    """Every starting assignment (name, blocks in slot order): both baselines, then the optimiser's orders."""
    if slurm_blocks is not None and dfs_blocks is not None:
        yield "slurm order", slurm_blocks
        yield "depth-first order", dfs_blocks
    aligned: dict[int, list[list[str]]] = {}
    for name, order, tile in optimiser.logical_orders(physical):
        # Tiles fill leaves best when each leaf takes whole tiles: leaf-aligned nodes first.
        if tile > 1 and tile not in aligned:
            aligned[tile] = _tile_aligned(topology, every_block, tile)[:blocks_needed]
        places = physical if tile <= 1 else aligned[tile]
        # Logical block order[p] goes to place p: block b's place is where b stands in the order.
        place_of = sorted(range(len(order)), key=order.__getitem__)
        yield name, list(map(places.__getitem__, place_of))


def _node_units(topology: Topology, nodes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each node's unit at every level, as Topology.units gives it: the nodes of a leaf share the
    switches above it, so each leaf's path is walked once."""
    depth = topology.depth()
    above: dict[str, tuple[str, ...]] = {}
    out = {}
    for node in nodes:
        leaf = topology.leaf_of[node]
        path = above.get(leaf)
        if path is None:
            switches = topology.switch_path(node)
            path = above[leaf] = (*switches, *[TOP] * (depth - len(switches)))
        out[node] = (topology.domain(node), *path)
    return out


def _unit_numbers(node_units: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[int, ...]]:
    """Each node's unit at every level (0 = NVLink domain, 1 = leaf, ...) as a number, one numbering for all."""
    numbers: list[dict[str, int]] = []
    out = {}
    for node, units in node_units.items():
        while len(numbers) < len(units):
            numbers.append({})
        out[node] = tuple(numbers[level].setdefault(unit, len(numbers[level])) for level, unit in enumerate(units))
    return out


def _check_nodes(topology: Topology, allocated: Sequence[str]) -> None:
    if not allocated:
        raise PlacementError("no nodes given; pass a node list (e.g. --nodelist 'node[1-4]')")
    seen: set[str] = set()
    duplicates = [n for n in allocated if n in seen or seen.add(n)]  # type: ignore[func-returns-value]
    if duplicates:
        raise PlacementError(f"nodes listed twice: {hostlist.compress(duplicates)}")
    unknown = [n for n in allocated if n not in topology.leaf_of]
    if unknown:
        raise PlacementError(f"nodes not in the topology ({topology.source}): {hostlist.compress(unknown)}; "
                             "check the node names or the topology source")


def _nodes_per_domain(topology: Topology, allocated: Sequence[str]) -> int:
    counts: dict[str, int] = {}
    for node in allocated:
        counts[topology.domain(node)] = counts.get(topology.domain(node), 0) + 1
    return max(counts.values())


def _domain_blocks(topology: Topology, allocated: Sequence[str], block: int, needed: int) -> list[list[str]]:
    """All blocks of `block` nodes sharing an NVLink domain, in depth-first order."""
    by_domain: dict[str, list[str]] = {}
    for node in topology.dfs_order(allocated):
        by_domain.setdefault(topology.domain(node), []).append(node)
    blocks = [members[i:i + block] for members in by_domain.values()
              for i in range(0, len(members) - block + 1, block)]
    if len(blocks) < needed:
        raise PlacementError(f"needs {needed} groups of {block} nodes inside one NVLink domain, but the "
                             f"allocation has only {len(blocks)}; request more nodes per NVLink domain")
    return blocks


def _best_fit(topology: Topology, blocks: list[list[str]], needed: int) -> list[list[str]]:
    """The `needed` blocks that fill the fewest, fullest subtrees (best fit down the tree), in DFS order."""
    def path(blk: list[str]) -> tuple[str, ...]:
        return tuple(reversed(topology.switch_path(blk[0])))

    def choose(candidates: list[list[str]], need: int, depth: int) -> list[list[str]]:
        if need >= len(candidates):
            return candidates
        children: dict[str, list[list[str]]] = {}
        for blk in candidates:
            p = path(blk)
            children.setdefault(p[depth] if depth < len(p) else blk[0], []).append(blk)
        if len(children) == 1:
            only = next(iter(children.values()))
            return only[:need] if depth >= len(path(only[0])) else choose(only, need, depth + 1)
        fitting = [c for c in children.values() if len(c) >= need]
        if fitting:
            return choose(min(fitting, key=len), need, depth + 1)  # smallest subtree that holds it all
        chosen: list[list[str]] = []
        for members in sorted(children.values(), key=len, reverse=True):  # fullest first
            take = min(len(members), need - len(chosen))
            chosen += members if take == len(members) else choose(members, take, depth + 1)
            if len(chosen) == need:
                break
        return chosen

    selected = {id(b) for b in choose(blocks, needed, 0)}
    return [b for b in blocks if id(b) in selected]


def _tile_aligned(topology: Topology, blocks: list[list[str]], tile: int) -> list[list[str]]:
    """Blocks ordered so every leaf contributes whole tiles first, its remainder after all tiles."""
    per_leaf: dict[str, list[list[str]]] = {}
    for blk in blocks:
        per_leaf.setdefault(topology.leaf_of[blk[0]], []).append(blk)
    aligned, rest = [], []
    for members in per_leaf.values():
        cut = len(members) // tile * tile
        aligned += members[:cut]
        rest += members[cut:]
    return aligned + rest


class _Optimiser:
    """Works on blocks (k consecutive slots ↔ k nodes of one NVLink domain)."""

    def __init__(self, layout: ParallelLayout, gpus_per_node: int, block: int, groups: Mapping[str, SlotGroups],
                 topology: Topology, weights: Mapping[str, float], unit_numbers: Mapping[str, tuple[int, ...]]) -> None:
        self.layout, self.gpn, self.block, self.topology = layout, gpus_per_node, block, topology
        self.upper_units = {node: numbers[1:] for node, numbers in unit_numbers.items()}
        self.depth = topology.depth()
        nblocks = layout.world_size // gpus_per_node // block
        self.nblocks = nblocks
        # Hyperedges over blocks at levels >= 1 (level 0 is fixed by the layout itself).
        edges: dict[tuple[int, ...], float] = {}
        for kind, g in groups.items():
            for slots, count in zip(g.slot_sets, g.multiplicity):
                key = tuple(sorted({s // block for s in slots}))
                if len(key) > 1:
                    edges[key] = edges.get(key, 0.0) + weights.get(kind, 1.0) * count
        self.edges = list(edges)
        self.edge_weight = list(edges.values())
        self.penalty = [group_penalty(span) for span in range(max(map(len, self.edges), default=0) + 1)]
        self.member_sets = [set(members) for members in self.edges]
        self.edges_of: list[list[int]] = [[] for _ in range(nblocks)]
        for e, members in enumerate(self.edges):
            for b in members:
                self.edges_of[b].append(e)
        sizes = [layout.size(d) if d != "ep" else 1 for d in layout.order_dims()]
        self.coords = [_grid_coordinates(b * block * gpus_per_node, sizes) for b in range(nblocks)]
        self.varying = [d for d in range(len(self.coords[0])) if len({c[d] for c in self.coords}) > 1]
        self.dim_names = layout.order_dims()

    def units(self, blk: list[str]) -> tuple[int, ...]:
        """The block's unit at levels 1.. (leaf and above), numbered: only equality matters."""
        return self.upper_units[blk[0]]

    def objective(self, assignment: Sequence[list[str]]) -> float:
        first_nodes = map(itemgetter(0), assignment)
        unit_at_level = [column.__getitem__ for column in zip(*map(self.upper_units.__getitem__, first_nodes))]
        level_weights = [level_weight(level + 1) for level in range(self.depth)]
        total = 0.0
        for members, weight in zip(self.edges, self.edge_weight):
            for level, unit_of in enumerate(unit_at_level):
                total += weight * level_weights[level] * self.penalty[len(set(map(unit_of, members)))]
        return total

    def logical_orders(self, physical: Sequence[list[str]]) -> Iterator[tuple[str, list[int], int]]:
        """Candidate orders of logical blocks (name, order, tile size): row orders and leaf-sized tiles,
        each different (order, tile) once under its first name, at most 32; made one at a time."""
        seen: set[tuple[bytes, int]] = set()
        for name, order, tile in self._orders(physical):
            # A digest stands for the order: 32 orders of a 100,000-node job need not all be held.
            key = (hashlib.blake2b(array("q", order).tobytes(), digest_size=16).digest(), tile)
            if key not in seen:
                seen.add(key)
                yield name, order, tile
                if len(seen) == 32:
                    return

    def _orders(self, physical: Sequence[list[str]]) -> Iterator[tuple[str, list[int], int]]:
        blocks = range(self.nblocks)
        yield "depth-first order of best-fit nodes", list(blocks), 1
        dims = self.varying
        if not dims:
            return
        capacities: dict[str, int] = {}
        for blk in physical:
            leaf = self.topology.leaf_of[blk[0]]
            capacities[leaf] = capacities.get(leaf, 0) + 1
        sizes = {d: len({c[d] for c in self.coords}) for d in dims}
        for slow in dims:
            for fast in dims:
                if fast == slow:
                    continue
                shapes: set[tuple[bool, float, int, int, int]] = set()
                ordered = sorted(capacities.values())
                quantiles = {ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.25, 0.5, 0.75, 1.0)}
                for capacity in sorted(quantiles, reverse=True):
                    for a in _divisors(sizes[fast]):
                        b = max(1, min(sizes[slow], capacity // a))
                        if a * b < max(1, capacity // 2) or a * b > capacity:
                            continue
                        # Tiles holding whole groups of one kind first (those groups never cross), then fullest.
                        whole = a == sizes[fast] or b == sizes[slow]
                        shapes.add((not whole, -(a * b) / capacity, abs(a - b), a, b))
                for *_, a, b in sorted(shapes)[:4]:
                    key = _tile_key(fast, slow, a, b, dims)
                    name = f"tiles of {a} ({self.dim_names[fast]}) × {b} ({self.dim_names[slow]})"
                    yield name, self._sorted(key), a * b
        for dim in dims:  # plain row orders: each dimension as the fastest
            rest = [d for d in dims if d != dim]
            yield f"{self.dim_names[dim]}-major rows", self._sorted(_row_key(rest, dim)), 1

    def _sorted(self, key: Callable[[tuple[int, ...]], tuple[int, ...]]) -> list[int]:
        """Block numbers sorted by `key` of their coordinates (stable: ties keep block order)."""
        keys = list(map(key, self.coords))
        return sorted(range(self.nblocks), key=keys.__getitem__)

    def polish(self, assignment: list[list[str]], spares: list[list[str]], score: float,
               tries: int | None) -> tuple[list[list[str]], int, float]:
        """Pairwise swaps across leaves that lower the objective; unused (spare) nodes may swap in."""
        used = len(assignment)
        assignment = assignment + spares
        n = len(assignment)
        if n < 2 or not self.edges:
            return assignment[:used], 0, score
        edges_of = self.edges_of + [[] for _ in spares]  # a spare position carries no group
        unit_of = [self.units(blk) for blk in assignment]
        counts: list[list[dict[int, int]]] = []
        for members in self.edges:
            per_level = []
            for level in range(self.depth):
                c: dict[int, int] = {}
                for b in members:
                    c[unit_of[b][level]] = c.get(unit_of[b][level], 0) + 1
                per_level.append(c)
            counts.append(per_level)

        def delta(a: int, b: int) -> float:
            ua, ub = unit_of[a], unit_of[b]
            change = 0.0
            for src, dst_units, src_units in ((a, ub, ua), (b, ua, ub)):
                for e in edges_of[src]:
                    if (b if src == a else a) in self.member_sets[e]:
                        continue  # both ends move within this group: its spans do not change
                    for level in range(self.depth):
                        old, new = src_units[level], dst_units[level]
                        if old == new:
                            continue
                        c = counts[e][level]
                        span = len(c)
                        after = span + (1 if c.get(new, 0) == 0 else 0) - (1 if c[old] == 1 else 0)
                        change += self.edge_weight[e] * level_weight(level + 1) * (
                            group_penalty(after) - group_penalty(span))
            return change

        def apply(a: int, b: int) -> None:
            for src, old_units, new_units in ((a, unit_of[a], unit_of[b]), (b, unit_of[b], unit_of[a])):
                for e in edges_of[src]:
                    for level in range(self.depth):
                        c = counts[e][level]
                        c[old_units[level]] -= 1
                        if not c[old_units[level]]:
                            del c[old_units[level]]
                        c[new_units[level]] = c.get(new_units[level], 0) + 1
            unit_of[a], unit_of[b] = unit_of[b], unit_of[a]
            assignment[a], assignment[b] = assignment[b], assignment[a]

        swaps = 0
        if tries is None and n <= 64:
            improved = True
            while improved:  # exhaustive first-improvement passes until a local optimum
                improved = False
                for a in range(n):
                    for b in range(a + 1, n):
                        if unit_of[a] != unit_of[b] and delta(a, b) < -1e-9:
                            score += delta(a, b)
                            apply(a, b)
                            swaps += 1
                            improved = True
        else:
            rng = random.Random(0)  # fixed seed: the same input always gives the same map
            for _ in range(tries if tries is not None else min(20 * n, 5000)):
                a, b = rng.randrange(n), rng.randrange(n)
                if unit_of[a] != unit_of[b]:
                    d = delta(a, b)
                    if d < -1e-9:
                        score += d
                        apply(a, b)
                        swaps += 1
        return assignment[:used], swaps, score


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid_coordinates(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """A rank's index along each dimension of the order (as ParallelLayout.coordinates, without names)."""
    out = []
    for size in sizes:
        out.append(rank % size)
        rank //= size
    return tuple(out)


def _row_key(rest: list[int], dim: int) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """Rows with `dim` varying fastest, then `rest` (last first)."""
    return lambda c: (*(c[i] for i in rest), c[dim])[::-1]


def _tile_key(fast: int, slow: int, a: int, b: int, dims: list[int]) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    others = [d for d in reversed(dims) if d not in (fast, slow)]

    def key(c: tuple[int, ...]) -> tuple[int, ...]:
        return (*(c[d] for d in others), c[slow] // b, c[fast] // a, c[slow] % b, c[fast] % a)

    def key_of_two(c: tuple[int, ...]) -> tuple[int, ...]:
        return (c[slow] // b, c[fast] // a, c[slow] % b, c[fast] % a)

    return key if others else key_of_two


def _explain(opt: _Optimiser, topology: Topology, assignment: Sequence[list[str]], strategy: str, start: float,
             end: float, swaps: int, allocated: int, needed: int) -> tuple[str, ...]:
    lines = []
    if allocated > needed and strategy not in ("slurm order", "depth-first order"):
        lines.append(f"{allocated} nodes allocated, {needed} needed: kept the fewest, fullest leaves (best fit).")
    elif allocated > needed:
        lines.append(f"{allocated} nodes allocated, {needed} needed: the first {needed} in {strategy} cost least.")
    lines.append(f"start: {strategy} (objective {start:g}); polish: {swaps} swaps → objective {end:g}.")
    per_leaf: dict[str, list[int]] = {}
    for b, blk in enumerate(assignment):
        per_leaf.setdefault(topology.leaf_of[blk[0]], []).append(b)
    for leaf, blocks in per_leaf.items():
        parts = []
        for d in opt.varying:
            values = sorted({opt.coords[b][d] for b in blocks})
            parts.append(f"{opt.dim_names[d]} {_ranges(values)}")
        shape = " × ".join(parts) if parts else "the whole job"
        count = len(blocks) * opt.block
        lines.append(f"{leaf}: {count} node{'s' if count != 1 else ''} ← {shape}")
    return tuple(lines)


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ",".join(out)

