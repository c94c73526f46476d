"""Shrinking a job inside its allocation (pure): when a node is lost and no spare is left, which smaller
data-parallel size the survivors can run, on which of them, and which to give back.

A shrink drops whole data-parallel replicas: tp, cp and pp stay as they are, so no tensor-, context- or
pipeline-parallel group is ever split, and the program only has to load its last checkpoint onto fewer DP
ranks (DCP reshards that).  The DP size chosen is the largest the spec allows (`restart.min_data_parallel`)
whose world fills whole nodes that the survivors have; the placement planner (placement.plan) picks the
nodes, as it does for every map: TP inside a node, PP/DP groups under a leaf.  Every survivor it does not
use is given back (a job must never hold nodes it does not use), except the batch host, where the agent
runs: the shrink keeps a rank on it whenever the map allows.

The recovery judge (recovery.py) asks `plan_shrink` and turns its answer into a decision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from clusterctl.errors import LayoutError, PlacementError
from clusterctl.launcher.pure.cost import DEFAULT_WEIGHTS
from clusterctl.launcher.pure.parallel import ParallelLayout, shrink_sizes, with_data_parallel
from clusterctl.launcher.pure.placement import PlannedMap, plan_once
from clusterctl.slurm.topology import Topology


@dataclass(frozen=True)
class JobShape:
    """What a shrink re-plans with: the layout the last step ran (its dp already below the spec's after an
    earlier shrink), the spec's own dp, the GPUs of a node, the job's topology and the placement weights
    (placement.weights)."""

    layout: ParallelLayout
    original_data_parallel: int
    gpus_per_node: int
    topology: Topology
    weights: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Shrink:
    """The next step's shape: `data_parallel` replicas on `nodes` (allocation order), `give_back`: the survivors
    it does not use (never the batch host); `batch_host_idle`: the map could not put a rank on the batch host
    (its NVLink block is incomplete), which the job keeps all the same: its agent runs there."""

    data_parallel: int
    nodes: tuple[str, ...]
    give_back: tuple[str, ...]
    batch_host_idle: bool = False
    planned: PlannedMap | None = field(default=None, compare=False, repr=False)
    """The last map planned on the way (over the survivors, or over `nodes` with the batch host): the step
    takes it when it plans the same inputs (placement.plan_once)."""


@dataclass(frozen=True)
class NoShrink:
    """Why the job cannot shrink, as a user reads it."""

    reason: str


def nodes_for(layout: ParallelLayout, gpus_per_node: int, data_parallel: int) -> int:
    """Nodes `layout` fills with `data_parallel` replicas (a size shrink_sizes gave: whole nodes)."""
    return layout.tp * layout.cp * layout.pp * data_parallel // gpus_per_node


def sizes_on(shape: JobShape, sizes: Sequence[int], node_count: int) -> list[int]:
    """The DP sizes of `sizes` (whole nodes each) whose world fits on `node_count` nodes, in their order."""
    return [dp for dp in sizes if nodes_for(shape.layout, shape.gpus_per_node, dp) <= node_count]


def placement_weights(shape: JobShape) -> dict[str, float]:
    """The planner's weights for `shape`: the defaults, with the spec's own over them."""
    return {**DEFAULT_WEIGHTS, **dict(shape.weights)}


def plan_shrink(shape: JobShape, survivors: Sequence[str], batch_host: str, min_data_parallel: int) -> Shrink | NoShrink:
    """The largest DP size from below the shape's down to `min_data_parallel` that the `survivors` (allocation
    order, the lost nodes already left out) can run, with its nodes and the ones to give back; or why none."""
    layout, gpus = shape.layout, shape.gpus_per_node
    if min_data_parallel >= layout.dp:
        return NoShrink(f"it already runs {layout.dp} data-parallel replicas (of {shape.original_data_parallel}), "
                        f"the fewest restart.min_data_parallel = {min_data_parallel} allows")
    sizes = shrink_sizes(layout, gpus, min_data_parallel)
    if not sizes:
        return NoShrink(f"no data-parallel size from {layout.dp - 1} down to {min_data_parallel} "
                        f"(restart.min_data_parallel) fills whole nodes of {gpus} GPUs with tp×cp×pp = "
                        f"{layout.tp * layout.cp * layout.pp} GPUs a replica")
    fitting = sizes_on(shape, sizes, len(survivors))
    if not fitting:
        smallest = sizes[-1]
        return NoShrink(f"{len(survivors)} nodes remain, and the smallest data-parallel size allowed (dp = "
                        f"{smallest}, restart.min_data_parallel = {min_data_parallel}) needs "
                        f"{nodes_for(layout, gpus, smallest)}")
    weights = placement_weights(shape)
    problems = []
    for dp in fitting:
        smaller = with_data_parallel(layout, dp)
        try:
            planned = plan_once(smaller, gpus, shape.topology, survivors, weights)
            if batch_host in survivors and batch_host not in planned.plan.rank_map.slots:
                planned = _onto_batch_host(smaller, shape, survivors, planned, batch_host, weights)
        except (PlacementError, LayoutError) as exc:
            problems.append(f"dp = {dp}: {exc}")
            continue
        used = set(planned.plan.rank_map.slots)
        return Shrink(dp, tuple(n for n in survivors if n in used),
                      tuple(n for n in survivors if n not in used and n != batch_host),
                      batch_host_idle=batch_host in survivors and batch_host not in used, planned=planned)
    return NoShrink(f"the {len(survivors)} surviving nodes hold no map of the allowed sizes ({'; '.join(problems)})")


def _onto_batch_host(layout: ParallelLayout, shape: JobShape, survivors: Sequence[str], first: PlannedMap,
                     batch_host: str, weights: dict[str, float]) -> PlannedMap:
    """The map re-planned with the batch host in place of one chosen node: the last, depth-first, of the leaf
    with the fewest chosen nodes (the one whose loss crosses the fewest groups).  When a node is only a part of
    an NVLink block the map keeps the first choice (the batch host stays, idle)."""
    if max(1, layout.nvlink_size() // shape.gpus_per_node) > 1:
        return first
    slots = first.plan.rank_map.slots
    leaf_of = shape.topology.leaf_of
    per_leaf = Counter(leaf_of[n] for n in slots)
    dropped = min(reversed(shape.topology.dfs_order(slots)), key=lambda n: per_leaf[leaf_of[n]])
    chosen = set(slots) - {dropped}
    pool = [n for n in survivors if n in chosen or n == batch_host]
    return plan_once(layout, shape.gpus_per_node, shape.topology, pool, weights)
