"""Growing back: when nodes are usable again, a shrunk job adds whole data-parallel replicas up to the spec's
size, at a checkpoint boundary only, asks Slurm for exactly the offered nodes its larger map uses, never a
blamed one; the route (expansion or a second allocation) follows the site's settings; the Slurm door asks for
nodes now or not at all and says clearly when Slurm refuses for another reason.

The Slurm answers below are NOT recorded from the testbed: they are derived from SchedMD's source
(src/salloc/salloc.c, src/common/slurm_errno.c, src/scontrol/update_job.c at tags slurm-22-05-11-1,
slurm-24-11-7-1 and slurm-26-05-3-1; see docs/measured.md, "Growing a running job").  Replace them with
recordings once the lead has run a grow on the testbed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.pure.grow import EXPAND, SECOND_ALLOCATION, Grow, NoGrow, choose_grow_route, plan_grow
from clusterctl.launcher.pure.parallel import ParallelLayout, grow_sizes, with_data_parallel
from clusterctl.launcher.pure.placement import plan
from clusterctl.launcher.pure.shrink import JobShape, nodes_for
from clusterctl.slurm.commands import Completed, Slurm, allocate_now_argv
from tests.unit.test_shrink import tree


def numbered(nodes):
    return sorted(nodes, key=lambda n: int(n[1:]))


@st.composite
def grows(draw):
    """A shrunk job: its layout at a dp below the spec's, the nodes it holds, the nodes offered, the blamed."""
    gpn = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= gpn]))
    pp = draw(st.integers(1, 3))
    per_node = gpn // tp  # replicas a node holds when pp = 1
    original = draw(st.integers(2, 4)) * per_node
    current = draw(st.integers(1, original - 1))
    layout = ParallelLayout(tp=tp, pp=pp, dp=current, order=draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp"])))
    topo = tree(draw(st.lists(st.integers(1, 6), min_size=1, max_size=5)))
    nodes = numbered(topo.leaf_of)
    held_count = -(-layout.world_size // gpn)
    held = numbered(draw(st.lists(st.sampled_from(nodes), unique=True, min_size=min(held_count, len(nodes)),
                                  max_size=min(held_count, len(nodes)))))
    rest = [n for n in nodes if n not in held]
    offered = draw(st.lists(st.sampled_from(rest), unique=True)) if rest else []
    blamed = draw(st.lists(st.sampled_from(offered), unique=True)) if offered else []
    return JobShape(layout, original, gpn, topo), held, offered, blamed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grows(), st.booleans())
def test_a_grow_adds_whole_replicas_up_to_the_spec_and_asks_only_for_offered_nodes_it_uses(case, at_checkpoint):
    shape, held, offered, blamed = case
    layout, gpn = shape.layout, shape.gpus_per_node
    result = plan_grow(shape, held, offered, held[0] if held else "", at_checkpoint=at_checkpoint, blamed=blamed)
    usable = [n for n in offered if n not in blamed]
    fitting = [dp for dp in grow_sizes(layout, gpn, shape.original_data_parallel)
               if nodes_for(layout, gpn, dp) <= len(held) + len(usable)]
    if not at_checkpoint or not fitting:
        assert isinstance(result, NoGrow) and result.reason
        return
    assert isinstance(result, Grow)
    assert result.data_parallel == max(fitting)  # TP inside a node: every size that fits has a map
    assert layout.dp < result.data_parallel <= shape.original_data_parallel
    assert set(result.ask) <= set(usable) and not set(result.ask) & set(blamed)
    assert set(result.give_back) <= set(held) and (not held or held[0] not in result.give_back)
    assert set(result.ask) <= set(result.nodes) <= set(held) | set(result.ask)
    assert set(result.give_back) == set(held) - set(result.nodes) - {held[0]}  # unused, but the batch host
    assert len(result.nodes) == nodes_for(layout, gpn, result.data_parallel)
    larger = with_data_parallel(layout, result.data_parallel)
    assert (larger.tp, larger.cp, larger.pp) == (layout.tp, layout.cp, layout.pp)
    assert set(plan(larger, gpn, shape.topology, result.nodes).rank_map.slots) == set(result.nodes)


def test_a_repaired_node_brings_the_lost_replica_back_at_the_next_checkpoint():
    # tp=8 (a node), pp=2: a replica is 2 nodes.  Shrunk from dp=2 to dp=1 on n1, n2; n3 repaired, n4 idle.
    shape = JobShape(ParallelLayout(tp=8, pp=2, dp=1), 2, 8, tree([4]))
    waiting = plan_grow(shape, ["n1", "n2"], ["n3", "n4"], "n1", at_checkpoint=False)
    assert isinstance(waiting, NoGrow) and "checkpoint" in waiting.reason
    result = plan_grow(shape, ["n1", "n2"], ["n3", "n4"], "n1", at_checkpoint=True)
    assert result == Grow(2, ("n1", "n2", "n3", "n4"), ("n3", "n4"))


def test_one_node_offered_is_not_enough_for_a_replica_of_two_and_nothing_is_asked():
    shape = JobShape(ParallelLayout(tp=8, pp=2, dp=1), 2, 8, tree([4]))
    result = plan_grow(shape, ["n1", "n2"], ["n3"], "n1", at_checkpoint=True)
    assert isinstance(result, NoGrow)
    assert "1 usable node offered" in result.reason and "needs 2" in result.reason


def test_a_blamed_node_is_never_asked_for_even_when_slurm_lists_it_idle():
    shape = JobShape(ParallelLayout(tp=8, pp=1, dp=2), 4, 8, tree([6]))
    result = plan_grow(shape, ["n1", "n2"], ["n3", "n4", "n5"], "n1", at_checkpoint=True, blamed=["n3"])
    assert isinstance(result, Grow)
    assert result.data_parallel == 4 and result.ask == ("n4", "n5")


def test_a_grow_never_goes_past_the_spec_s_size_even_with_many_nodes_offered():
    shape = JobShape(ParallelLayout(tp=8, pp=1, dp=2), 3, 8, tree([8]))
    result = plan_grow(shape, ["n1", "n2"], [f"n{i}" for i in range(3, 9)], "n1", at_checkpoint=True)
    assert isinstance(result, Grow) and result.data_parallel == 3 and len(result.ask) == 1


def test_a_job_at_full_size_does_not_grow():
    shape = JobShape(ParallelLayout(tp=8, pp=1, dp=2), 2, 8, tree([4]))
    result = plan_grow(shape, ["n1", "n2"], ["n3", "n4"], "n1", at_checkpoint=True)
    assert isinstance(result, NoGrow) and "all 2" in result.reason


@pytest.mark.parametrize(("params", "flags", "route"), [
    ("bf_interval=1,sched_min_interval=100000,nohold_on_prolog_fail", "Alloc", SECOND_ALLOCATION),
    ("bf_interval=1,permit_job_expansion", "Alloc,Contain", SECOND_ALLOCATION),
    ("bf_interval=1,permit_job_expansion", "Alloc,Contain,X11", SECOND_ALLOCATION),
    ("permit_job_expansion,bf_interval=1", "Alloc", EXPAND),
    (None, None, SECOND_ALLOCATION),
    ("(null)", "(null)", SECOND_ALLOCATION),
])
def test_the_route_follows_the_site_s_settings(params, flags, route):
    chosen = choose_grow_route(params, flags)
    assert chosen.route == route and chosen.why


class Recorded:
    """A runner that answers each command by its first word (derived answers, see the module's docstring)."""

    def __init__(self, answers: dict[str, Completed]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, argv: Sequence[str], timeout: float) -> Completed:
        self.calls.append((list(argv), timeout))
        return self.answers[argv[0]]


# salloc --no-shell prints its progress on stderr through info()/error() (src/salloc/salloc.c).
GRANTED = Completed(0, "", "salloc: Granted job allocation 4242\n")
BUSY = Completed(1, "", "salloc: error: Unable to allocate resources: Requested nodes are busy\n")
LOW_PRIORITY = Completed(1, "", "salloc: error: Unable to allocate resources: Immediate execution impossible, "
                                "insufficient priority\n")
NOT_PERMITTED = Completed(1, "", "salloc: error: Job submit/allocate failed: Requested operation not supported "
                                 "on this system\n")
STEP_EXISTS = Completed(1, "", "Job step already exists for job 4242\n")


def test_a_granted_expander_is_asked_for_exactly_the_offered_nodes_and_merged_into_the_job():
    runner = Recorded({"salloc": GRANTED, "scontrol": Completed(0, "", "")})
    slurm = Slurm(runner, timeout=30)
    argv = allocate_now_argv("gpu", ["n3", "n4"], 8, wait_seconds=5, expand_job="4100")
    assert slurm.allocate_now(argv) == "4242"
    slurm.merge_into_job("4242")
    (salloc, salloc_timeout), (scontrol, _) = runner.calls
    assert salloc[:2] == ["salloc", "--no-shell"] and "--immediate=5" in salloc and salloc_timeout == 35
    assert "--nodelist=n[3-4]" in salloc and "--nodes=2" in salloc and "--dependency=expand:4100" in salloc
    assert not any(a.startswith("--time") for a in salloc)  # Slurm gives an expander the job's end time
    assert scontrol == ["scontrol", "update", "JobId=4242", "NumNodes=0"]


def test_a_second_allocation_is_exclusive_and_ends_no_later_than_the_job():
    argv = allocate_now_argv("gpu", ["n3"], 8, wait_seconds=5, minutes=90, qos="high")
    assert "--exclusive" in argv and "--time=90" in argv and "--qos=high" in argv
    assert not any(a.startswith("--dependency") for a in argv)
    with pytest.raises(SlurmCommandError, match="time limit"):
        allocate_now_argv("gpu", ["n3"], 8, wait_seconds=5)


@pytest.mark.parametrize("answer", [BUSY, LOW_PRIORITY])
def test_nodes_that_cannot_be_had_now_are_not_an_error(answer):
    slurm = Slurm(Recorded({"salloc": answer}))
    assert slurm.allocate_now(allocate_now_argv("gpu", ["n3"], 8, wait_seconds=5, expand_job="4100")) is None


def test_a_site_without_job_expansion_is_told_in_slurm_s_words():
    slurm = Slurm(Recorded({"salloc": NOT_PERMITTED}))
    with pytest.raises(SlurmCommandError, match="not supported on this system"):
        slurm.allocate_now(allocate_now_argv("gpu", ["n3"], 8, wait_seconds=5, expand_job="4100"))


def test_an_expander_with_a_step_is_refused_in_slurm_s_words():
    slurm = Slurm(Recorded({"scontrol": STEP_EXISTS}))
    with pytest.raises(SlurmCommandError, match="Job step already exists"):
        slurm.merge_into_job("4242")


@pytest.mark.parametrize("bad", ["--help", "n[1-2]", "n1,n2", ""])
def test_odd_node_names_and_ids_never_reach_salloc_or_scontrol(bad):
    with pytest.raises(SlurmCommandError):
        allocate_now_argv("gpu", [bad], 8, wait_seconds=5, minutes=10)
    with pytest.raises(SlurmCommandError):
        Slurm(Recorded({})).merge_into_job(bad or "-1")
