"""Shrinking inside the allocation: when no spare is left, the job goes on with fewer data-parallel replicas on
the nodes that survive, gives back every node it does not use, and never splits a TP or PP group; the spec says
how far it may shrink (restart.min_data_parallel) and refuses a floor the layout cannot reach."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.errors import SpecError
from clusterctl.launcher.pure.parallel import ParallelLayout, shrink_sizes, with_data_parallel
from clusterctl.launcher.pure.placement import plan
from clusterctl.launcher.pure.shrink import JobShape, NoShrink, Shrink, nodes_for, plan_shrink
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.slurm.topology import parse_topology_conf


def tree(leaf_sizes: list[int]):
    lines, start = [], 1
    for i, size in enumerate(leaf_sizes):
        lines.append(f"SwitchName=l{i} Nodes=n[{start}-{start + size - 1}]")
        start += size
    lines.append("SwitchName=spine Switches=" + ",".join(f"l{i}" for i in range(len(leaf_sizes))))
    return parse_topology_conf("\n".join(lines))


@st.composite
def shrinks(draw):
    """A job that lost nodes: its layout, the topology, the survivors (allocation order, batch host first), the
    floor."""
    gpn = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= gpn]))
    pp = draw(st.integers(1, 3))
    dp = draw(st.integers(1, 4)) * gpn // tp
    order = draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp"]))
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, order=order)
    needed = layout.world_size // gpn
    topo = tree(draw(st.lists(st.integers(1, 6), min_size=1, max_size=5)))
    nodes = sorted(topo.leaf_of, key=lambda n: int(n[1:]))
    survivors = draw(st.lists(st.sampled_from(nodes), unique=True, min_size=1, max_size=max(1, needed - 1)))
    survivors = sorted(survivors, key=lambda n: int(n[1:]))
    floor = draw(st.integers(1, dp))
    return JobShape(layout, dp, gpn, topo), survivors, floor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shrinks())
def test_a_shrink_drops_whole_replicas_uses_every_node_it_keeps_and_is_as_large_as_the_survivors_allow(case):
    shape, survivors, floor = case
    layout, gpn = shape.layout, shape.gpus_per_node
    batch_host = survivors[0]
    result = plan_shrink(shape, survivors, batch_host, floor)
    fitting = [dp for dp in shrink_sizes(layout, gpn, floor) if nodes_for(layout, gpn, dp) <= len(survivors)]
    if not fitting:
        assert isinstance(result, NoShrink) and result.reason
        return
    assert isinstance(result, Shrink)
    assert result.data_parallel == max(fitting)  # TP inside a node: every size that fits has a map
    assert floor <= result.data_parallel < layout.dp
    kept, given_back = set(result.nodes), set(result.give_back)
    assert len(result.nodes) == nodes_for(layout, gpn, result.data_parallel)
    assert kept | given_back == set(survivors) and not kept & given_back
    assert batch_host in kept and not result.batch_host_idle  # one node an NVLink block: the batch host runs ranks
    assert list(result.nodes) == [n for n in survivors if n in kept]
    smaller = with_data_parallel(layout, result.data_parallel)
    assert (smaller.tp, smaller.cp, smaller.pp) == (layout.tp, layout.cp, layout.pp)
    rank_map = plan(smaller, gpn, shape.topology, result.nodes).rank_map
    assert set(rank_map.slots) == kept  # the kept nodes are exactly the next map's
    for group in smaller.groups("tp"):
        assert len({rank // gpn for rank in group}) == 1  # every TP group inside one node


def test_losing_one_node_of_four_with_no_spare_drops_one_replica_of_two_nodes_and_gives_one_back():
    # tp=8 (a node), pp=2: a replica is 2 nodes; dp=2 on 4 nodes.  One lost: 3 remain, room for one replica.
    topo = tree([4])
    shape = JobShape(ParallelLayout(tp=8, pp=2, dp=2), 2, 8, topo)
    result = plan_shrink(shape, ["n1", "n2", "n4"], "n1", 1)
    assert isinstance(result, Shrink)
    assert result.data_parallel == 1 and len(result.nodes) == 2 and "n1" in result.nodes
    assert len(result.give_back) == 1 and set(result.nodes) | set(result.give_back) == {"n1", "n2", "n4"}


def test_a_floor_the_survivors_cannot_hold_is_refused_with_the_numbers():
    shape = JobShape(ParallelLayout(tp=8, dp=4), 4, 8, tree([4]))
    result = plan_shrink(shape, ["n1", "n2"], "n1", 3)
    assert result == NoShrink("2 nodes remain, and the smallest data-parallel size allowed (dp = 3, "
                              "restart.min_data_parallel = 3) needs 3")


def test_a_job_already_at_its_floor_cannot_shrink_further():
    shape = JobShape(ParallelLayout(tp=8, dp=2), 4, 8, tree([4]))
    result = plan_shrink(shape, ["n1"], "n1", 2)
    assert isinstance(result, NoShrink) and "already runs 2 data-parallel replicas (of 4)" in result.reason


def test_the_batch_host_takes_ranks_even_when_best_fit_would_leave_it_out():
    # The batch host alone on its leaf; the other leaf has room for the shrunk job: it still runs ranks.
    topo = tree([1, 4])
    shape = JobShape(ParallelLayout(tp=8, dp=4), 4, 8, topo)
    result = plan_shrink(shape, ["n1", "n2", "n3", "n4"], "n1", 1)
    assert isinstance(result, Shrink) and result.data_parallel == 3
    assert "n1" in result.nodes and len(result.give_back) == 1 and "n1" not in result.give_back


SPEC = """
[job]
name = "toy"
nodes = 4
gpus_per_node = 8
[launch]
command = ["python3", "train.py"]
[parallel]
tp = 4
ep = {ep}
[restart]
{floor}
"""


def _spec(floor: str, ep: int = 1):
    return parse_spec(SPEC.format(floor=floor, ep=ep), "spec.toml")


def test_a_spec_without_a_floor_never_shrinks_and_one_with_a_reachable_floor_keeps_it():
    assert _spec("").restart.min_data_parallel == 8  # tp=4 on 32 GPUs: dp 8, the default floor
    assert _spec("min_data_parallel = 4").restart.min_data_parallel == 4


@pytest.mark.parametrize(("floor", "ep", "said"), [
    ("min_data_parallel = 9", 1, r"spec.toml:\d+, key `restart.min_data_parallel`: is 9, above parallel.dp = 8"),
    ("min_data_parallel = 3", 1, r"key `restart.min_data_parallel`: the job cannot shrink to dp = 3 \(one DP replica is "
                                 r"tp×cp×pp = 4 GPUs, so dp = 3 leaves 12 GPUs, not whole nodes of 8\); choose one "
                                 r"of 6, 4, 2, or 8 \(never shrink\)"),
    ("min_data_parallel = 2", 4, r"the job cannot shrink to dp = 2 \(ep = 4 does not divide cp×dp = 2\); choose "
                                 r"one of 4, or 8"),
    ("min_data_parallel = 0", 1, r"restart.min_data_parallel"),
    ("min_data_parallel = 'half'", 1, r"restart.min_data_parallel"),
])
def test_a_floor_the_layout_cannot_reach_is_a_clear_error_naming_the_key(floor, ep, said):
    with pytest.raises(SpecError, match=said):
        _spec(floor, ep)


def test_a_job_with_tiered_checkpoints_may_not_shrink_and_is_told_what_to_set():
    text = SPEC.format(floor="min_data_parallel = 4", ep=1) + '[checkpoint]\ndir = "/shared/ck"\ntiers = true\n'
    with pytest.raises(SpecError, match=r"spec.toml:\d+, key `restart.min_data_parallel`: is 4, below parallel.dp = 8, "
                                        r"with checkpoint.tiers = true: .*set restart.min_data_parallel = 8 \(never "
                                        r"shrink\) or turn checkpoint.tiers off"):
        parse_spec(text, "spec.toml")
    never = parse_spec(text.replace("min_data_parallel = 4", "min_data_parallel = 8"), "spec.toml")
    assert never.checkpoint.tiers and never.restart.min_data_parallel == 8
