"""Rank groups as frameworks form them, and layout validation messages."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import LayoutError
from clusterctl.launcher.pure.parallel import DIMS, ParallelLayout, layout_from_mapping, validate_for_cluster


def reference_groups(layout: ParallelLayout, kind: str) -> list[list[int]]:
    """Megatron's enumeration written from its definition: rank = Σ index_d · stride_d over the
    order (first fastest); a group fixes every other index; groups and members both
    enumerate their free indices first-fastest."""
    dims = layout.order_dims()
    if kind == "ep":
        sizes = {"tp": layout.tp, "cp": 1, "ep": layout.ep, "dp": layout.cp * layout.dp // layout.ep, "pp": layout.pp}
    else:
        sizes = {"tp": layout.tp, "cp": layout.cp, "ep": 1, "dp": layout.dp, "pp": layout.pp}
    strides, acc = {}, 1
    for d in dims:
        strides[d], acc = acc, acc * sizes[d]
    others = [d for d in dims if d != kind]

    def first_fastest(ds):
        ranges = [range(sizes[d]) for d in reversed(ds)]
        for combo in itertools.product(*ranges):
            yield dict(zip(reversed(ds), combo))

    return [[sum(strides[d] * idx for d, idx in {**fixed, kind: i}.items()) for i in range(sizes[kind])]
            for fixed in first_fastest(others)]


layouts = st.builds(
    lambda tp, cp, dp, pp, ep_div, order: ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp,
                                                          ep=[d for d in range(1, cp * dp + 1) if cp * dp % d == 0][
                                                              ep_div % len([d for d in range(1, cp * dp + 1)
                                                                            if cp * dp % d == 0])],
                                                          order=order),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.integers(1, 4), st.integers(1, 3), st.integers(0, 5),
    st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp", "tp-cp-dp-pp", "tp-dp-cp-pp"]),
).filter(lambda lay: set(d for d in DIMS if lay.size(d) > 1) <= set(lay.order.split("-")))


@given(layouts)
def test_groups_match_the_frameworks_formula(layout):
    for kind in DIMS:
        assert layout.groups(kind) == reference_groups(layout, kind)


@given(layouts)
def test_every_kind_partitions_the_ranks(layout):
    for kind in DIMS:
        groups = layout.groups(kind)
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
        size = layout.ep if kind == "ep" else layout.size(kind)
        assert all(len(g) == size for g in groups)


def test_megatron_small_example():
    layout = ParallelLayout(tp=2, pp=2, dp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ParallelLayout(tp=2, pp=2, dp=2, order="tp-pp-dp").groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]


@pytest.mark.parametrize("values, nodes, message", [
    ({"tp": 8, "pp": 2, "dp": 3}, 4, "= 48 GPUs, but 4 nodes × 8 GPUs = 32; set dp=2"),
    ({"tp": 16, "pp": 1, "dp": 2}, 4, "tp = 16 GPUs must share one NVLink domain, which has 8 GPUs; lower tp"),
    ({"tp": 3, "pp": 1, "dp": 8}, 3, "tp = 3 does not divide the 8 GPUs of a node"),
])
def test_impossible_layouts_say_which_number_to_change(values, nodes, message):
    with pytest.raises(LayoutError, match=message.replace("(", r"\(")):
        validate_for_cluster(layout_from_mapping(values), nodes=nodes, gpus_per_node=8)


@pytest.mark.parametrize("values, message", [
    ({"tp": 0}, "`tp` must be a whole number of at least 1, found 0"),
    ({"tp": 2, "tpp": 2}, "unknown key 'tpp'"),
    ({"order": "tp-xx"}, "order 'tp-xx' must be a framework"),
    ({"cp": 2, "order": "tp-pp-dp"}, "cp=2 but the order 'tp-pp-dp' has no cp"),
    ({"tp": 2, "dp": 3, "ep": 2}, "ep=2 must divide cp×dp=3"),
    ({"tp": 2, "dp": 2, "order": "dp-tp-pp"}, "tp must come first in the order"),
])
def test_bad_layout_values(values, message):
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace("[", r"\[")):
        layout_from_mapping(values)


def test_frameworks_resolve_to_orders():
    assert layout_from_mapping({"framework": "torchtitan"}).order == "tp-cp-dp-pp"
    assert layout_from_mapping({"order": "megatron-tp-pp-dp"}).order == "tp-pp-dp"


@given(layouts)
def test_coordinates_place_every_rank_once_and_groups_vary_in_their_own_dimension_only(layout):
    coordinates = [tuple(layout.coordinates(rank).values()) for rank in range(layout.world_size)]
    assert len(set(coordinates)) == layout.world_size  # a bijection between ranks and index tuples
    for kind in ("tp", "cp", "dp", "pp"):
        for group in layout.groups(kind):
            others = {tuple(v for d, v in layout.coordinates(r).items() if d != kind) for r in group}
            assert len(others) == 1
