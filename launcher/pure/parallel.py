"""Parallel layouts (TP, CP, EP, DP, PP) and the rank groups a framework forms from them.

Frameworks lay ranks out on a fixed grid: with Megatron's default order
`tp-cp-ep-dp-pp`, TP varies fastest (ranks 0..tp-1 form the first TP group), then CP,
then DP, then PP.  `groups()` enumerates every group exactly as the framework does,
without importing it: a group of kind K holds the ranks that differ only in K's index.
Megatron carves expert parallelism out of the data-parallel ranks (expert DP =
tp·cp·dp / (tp·ep)), which `groups("ep")` follows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from math import prod

from clusterctl.errors import LayoutError

DIMS = ("tp", "cp", "ep", "dp", "pp")
DP_SIZE_ENV = "CLUSTERCTL_DP_SIZE"
"""Each rank's current data-parallel size: below the spec's after the job shrank (docs/users-guide.md)."""
DP_SIZE_ORIGINAL_ENV = "CLUSTERCTL_DP_SIZE_ORIGINAL"
"""Each rank's spec data-parallel size (parallel.dp), whatever the job shrank to."""
DATA_PARALLEL_VARIABLES = (DP_SIZE_ENV, DP_SIZE_ORIGINAL_ENV)
FRAMEWORK_ORDERS = {
    "megatron": "tp-cp-ep-dp-pp",
    "megatron-tp-pp-dp": "tp-pp-dp",
    # torchtitan's device mesh is [pp, dp_replicate, dp_shard, cp, tp], last dimension fastest.
    "torchtitan": "tp-cp-dp-pp",
}


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of each parallel dimension and the rank order (fastest-varying first)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = FRAMEWORK_ORDERS["megatron"]
    nvlink_dims: tuple[str, ...] = ("tp",)
    """Dimensions whose groups must stay inside one NVLink domain."""

    @property
    def world_size(self) -> int:
        # EP does not multiply: expert-parallel ranks are a regrouping of DP×CP ranks.
        return self.tp * self.cp * self.dp * self.pp

    def size(self, dim: str) -> int:
        """The size of dimension `dim` (tp, pp, dp, cp or ep)."""
        return int(getattr(self, dim))

    def order_dims(self) -> list[str]:
        """The order as a list, with missing size-1 dimensions appended (as Megatron does)."""
        dims = self.order.split("-")
        return dims + [d for d in DIMS if d not in dims]

    def coordinates(self, rank: int) -> dict[str, int]:
        """A global rank's index along every dimension, in the order's dimension order (ep counts as 1:
        expert-parallel ranks regroup DP×CP ranks, they add no coordinate of their own)."""
        coords = {}
        for dim in self.order_dims():
            size = self.size(dim) if dim != "ep" else 1
            coords[dim] = rank % size
            rank //= size
        return coords

    def nvlink_size(self) -> int:
        """GPUs that must share one NVLink domain (product of the pinned dimensions)."""
        return prod(self.size(d) for d in self.nvlink_dims if d != "ep")

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of kind `dim` (each a list of global ranks, in the framework's order)."""
        return list(self.iter_groups(dim))

    def iter_groups(self, dim: str) -> Iterator[list[int]]:
        """`groups(dim)` one group at a time (a 100,000-GPU job need not hold them all)."""
        if dim not in DIMS:
            raise ValueError(dim)
        dims = self.order_dims()
        if dim == "ep":
            sizes = {"tp": self.tp, "cp": 1, "ep": self.ep, "dp": self.cp * self.dp // self.ep, "pp": self.pp}
        else:
            sizes = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        return iter_masked_rank_groups([sizes[d] for d in dims], [d == dim for d in dims])


def masked_rank_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Groups of ranks on a grid of `sizes` (first fastest) varying only in masked dimensions.

    Groups are listed by the index of the unmasked dimensions (first fastest); inside a
    group, ranks follow the masked dimensions (first fastest).  This is the enumeration
    Megatron's RankGenerator produces.
    """
    return list(iter_masked_rank_groups(sizes, mask))


def iter_masked_rank_groups(sizes: list[int], mask: list[bool]) -> Iterator[list[int]]:
    """`masked_rank_groups` one group at a time, in the same order."""
    strides = [prod(sizes[:i]) for i in range(len(sizes))]
    inside = [(s, st) for s, st, m in zip(sizes, strides, mask) if m]
    outside = [(s, st) for s, st, m in zip(sizes, strides, mask) if not m]
    offsets = _grid_offsets(inside)
    return ([base + off for off in offsets] for base in _grid_offsets(outside))


def _grid_offsets(dims: list[tuple[int, int]]) -> list[int]:
    offsets = [0]
    for size, stride in dims:
        offsets = [o + i * stride for i in range(size) for o in offsets]
    return offsets


def parse_order(text: str) -> str:
    """A framework name or an explicit order like `tp-pp-dp`; validated."""
    order = FRAMEWORK_ORDERS.get(text, text).lower()
    dims = order.split("-")
    bad = [d for d in dims if d not in DIMS]
    if bad or len(set(dims)) != len(dims):
        raise LayoutError(f"order {text!r} must be a framework ({', '.join(FRAMEWORK_ORDERS)}) or dimensions "
                          f"{'-'.join(DIMS)} each at most once, joined by '-'")
    return order


def layout_from_mapping(values: Mapping[str, object], *, where: str = "layout") -> ParallelLayout:
    """Build a layout from a spec's `[parallel]` table or CLI options; unknown keys are errors."""
    known = set(DIMS) | {"order", "framework", "nvlink_dims"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise LayoutError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    sizes: dict[str, int] = {}
    for dim in DIMS:
        value = values.get(dim, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LayoutError(f"{where}: `{dim}` must be a whole number of at least 1, found {value!r}")
        sizes[dim] = value
    order_text = values.get("order") or values.get("framework") or "megatron"
    if not isinstance(order_text, str):
        raise LayoutError(f"{where}: `order` must be a string, found {order_text!r}")
    order = parse_order(order_text)
    pinned = values.get("nvlink_dims", ("tp",))
    if isinstance(pinned, str):
        pinned = tuple(p for p in pinned.split(",") if p)
    pinned = tuple(pinned)  # type: ignore[arg-type]
    layout = ParallelLayout(order=order, nvlink_dims=pinned, **sizes)
    _check_order(layout, where)
    return layout


def _check_order(layout: ParallelLayout, where: str) -> None:
    dims = layout.order.split("-")
    for dim in DIMS:
        if layout.size(dim) > 1 and dim not in dims:
            raise LayoutError(f"{where}: {dim}={layout.size(dim)} but the order {layout.order!r} has no {dim}; "
                              f"add it to the order or set {dim}=1")
    for dim in layout.nvlink_dims:
        if dim not in DIMS:
            raise LayoutError(f"{where}: nvlink_dims names {dim!r}; choose from {', '.join(DIMS)}")
    order = layout.order_dims()
    pinned = [d for d in order if d in layout.nvlink_dims and layout.size(d) > 1]
    leading = [d for d in order if layout.size(d) > 1][: len(pinned)]
    if pinned != leading:
        raise LayoutError(f"{where}: {'×'.join(pinned)} must stay in one NVLink domain, so "
                          f"{', '.join(pinned)} must come first in the order (found {layout.order!r})")
    if layout.ep > 1 and (layout.cp * layout.dp) % layout.ep:
        raise LayoutError(f"{where}: ep={layout.ep} must divide cp×dp={layout.cp * layout.dp}; "
                          f"change ep to a divisor of {layout.cp * layout.dp}")


def validate_for_cluster(layout: ParallelLayout, *, nodes: int, gpus_per_node: int,
                         nodes_per_nvlink_domain: int = 1) -> None:
    """Raise LayoutError if the layout cannot run on `nodes` nodes; say which number to change."""
    gpus = nodes * gpus_per_node
    product = layout.world_size
    dims = "×".join(f"{d}" for d in ("tp", "cp", "dp", "pp"))
    if product != gpus:
        rest = layout.tp * layout.cp * layout.pp
        hint = (f"set dp={gpus // rest}" if gpus % rest == 0 else
                f"use {product // gpus_per_node} nodes" if product % gpus_per_node == 0 else
                f"make {dims} a multiple of {gpus_per_node}")
        raise LayoutError(f"{dims} = {layout.tp}×{layout.cp}×{layout.dp}×{layout.pp} = {product} GPUs, but "
                          f"{nodes} nodes × {gpus_per_node} GPUs = {gpus}; {hint}")
    pinned = layout.nvlink_size()
    domain = gpus_per_node * nodes_per_nvlink_domain
    names = "×".join(d for d in layout.nvlink_dims if d != "ep") or "tp"
    if pinned > domain:
        raise LayoutError(f"{names} = {pinned} GPUs must share one NVLink domain, which has {domain} GPUs; "
                          f"lower {names} to at most {domain} or declare larger NVLink domains")
    if pinned > gpus_per_node and pinned % gpus_per_node:
        raise LayoutError(f"{names} = {pinned} spans nodes but is not a multiple of {gpus_per_node} GPUs per node; "
                          f"use a multiple of {gpus_per_node}")
    if pinned < gpus_per_node and gpus_per_node % pinned:
        raise LayoutError(f"{names} = {pinned} does not divide the {gpus_per_node} GPUs of a node, so some groups "
                          f"would straddle two nodes; use a divisor of {gpus_per_node}")


def shrink_sizes(layout: ParallelLayout, gpus_per_node: int, minimum: int) -> tuple[int, ...]:
    """The data-parallel sizes `layout` may shrink to, largest first: from below its dp down to `minimum`, each
    dropping whole DP replicas (tp, cp and pp unchanged, so no TP or PP group is split) and leaving a world that
    fills whole nodes and is still a valid layout (ep divides cp×dp, NVLink groups as before)."""
    return tuple(dp for dp in range(layout.dp - 1, max(minimum, 1) - 1, -1)
                 if _whole_replicas_fit(layout, gpus_per_node, dp))


def grow_sizes(layout: ParallelLayout, gpus_per_node: int, maximum: int) -> tuple[int, ...]:
    """The data-parallel sizes `layout` may grow back to, largest first: from `maximum` (the spec's dp) down to
    above its dp, under the same rules as shrink_sizes (whole replicas, whole nodes, a valid layout)."""
    return tuple(dp for dp in range(maximum, layout.dp, -1) if _whole_replicas_fit(layout, gpus_per_node, dp))


def _whole_replicas_fit(layout: ParallelLayout, gpus_per_node: int, dp: int) -> bool:
    """`layout` at `dp` replicas fills whole nodes and is a valid layout."""
    replica = layout.tp * layout.cp * layout.pp
    if replica * dp % gpus_per_node:
        return False
    if layout.ep > 1 and (layout.cp * dp) % layout.ep:
        return False
    nodes = replica * dp // gpus_per_node
    try:
        validate_for_cluster(with_data_parallel(layout, dp), nodes=nodes, gpus_per_node=gpus_per_node,
                             nodes_per_nvlink_domain=nodes)
    except LayoutError:
        return False
    return True


def with_data_parallel(layout: ParallelLayout, dp: int) -> ParallelLayout:
    """`layout` with `dp` data-parallel replicas (every other dimension as it is)."""
    return replace(layout, dp=dp)


def data_parallel_environment(original: int, current: int) -> dict[str, str]:
    """What a step's ranks are told about data parallelism: the spec's size and the one this step runs at (the
    same until the job shrinks); CLUSTERCTL_DP follows the step's layout, as {dp} does."""
    return {"CLUSTERCTL_DP": str(current), DP_SIZE_ENV: str(current), DP_SIZE_ORIGINAL_ENV: str(original)}
