"""The straggler verdict: report, exclude or swap, drain or not, and why; the same for the job's agent
and for the supervisor of a job without one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.pure.straggler_verdict import (
    NO_AGENT, NOT_EXPLAINED, StragglerVerdict, SwapRoom, straggler_verdict,
)

NODES = st.sampled_from(["node1", "node2", "node3"])
HARDWARE = st.lists(st.sampled_from(["GPU 3: HW slowdown", "GPU 1: SW thermal slowdown at 88 C"]), max_size=2)
ACTIONS = st.sampled_from(["off", "report", "exclude", "swap"])
ROOMS = st.none() | st.builds(SwapRoom, st.integers(0, 3), NODES)


@given(NODES, HARDWARE, ACTIONS, ROOMS, st.booleans())
def test_never_swaps_the_batch_host_nor_without_a_spare_nor_without_an_agent(node, hardware, action, room, can_drain):
    verdict = straggler_verdict(node, hardware, action, room, can_drain)
    if verdict.done == "swapped":
        assert action == "swap" and room is not None and room.spares >= 1 and node != room.batch_host


@given(NODES, HARDWARE, ACTIONS, ROOMS, st.booleans())
def test_never_drains_without_gpu_evidence_that_explains_the_slowdown_nor_without_a_door(node, hardware, action,
                                                                                          room, can_drain):
    verdict = straggler_verdict(node, hardware, action, room, can_drain)
    if verdict.drain:
        assert hardware and can_drain and verdict.evicted and not verdict.drain_note


@given(NODES, HARDWARE, st.sampled_from(["off", "report"]), ROOMS, st.booleans())
def test_a_report_only_policy_never_acts(node, hardware, action, room, can_drain):
    assert straggler_verdict(node, hardware, action, room, can_drain) == StragglerVerdict("reported")


@given(NODES, HARDWARE, st.sampled_from(["exclude", "swap"]), ROOMS, st.booleans())
def test_an_evicted_node_not_drained_says_why(node, hardware, action, room, can_drain):
    verdict = straggler_verdict(node, hardware, action, room, can_drain)
    assert verdict.evicted and (verdict.drain or verdict.drain_note == NOT_EXPLAINED)


def test_a_swap_that_cannot_happen_excludes_and_says_why():
    def notes(room: SwapRoom | None, node: str = "node2") -> tuple[str, ...]:
        verdict = straggler_verdict(node, (), "swap", room, True)
        assert verdict.done == "excluded"
        return verdict.notes

    assert notes(SwapRoom(0, "node1")) == ("not swapped: no spare left; avoided from the next resubmission on",)
    assert notes(SwapRoom(0, "node2")) == ("not swapped: node2 is the batch host, where this agent runs; avoided "
                                           "from the next resubmission on",)
    assert notes(None) == (f"not swapped: {NO_AGENT}; avoided from the next resubmission on",)
    swapped = straggler_verdict("node2", ("GPU 3: HW slowdown",), "swap", SwapRoom(1, "node1"), True)
    assert swapped == StragglerVerdict("swapped", drain=True)
