"""A node healthd drained returns to service only on a passed diagnostic newer than its drain (when one is
configured): through the engine's public step, as the daemon drives it, and as a property over random histories."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.clock import utc
from clusterctl.healthd.diagnostics import DiagnosticSpec, Diagnostics
from clusterctl.healthd.engine import (
    EngineSettings, EngineState, Resume, RunDiagnostic, diagnosed, state_view, step,
)
from clusterctl.healthd.findings import Action
from clusterctl.records.drain_reason import DrainReason
from clusterctl.records.healthd_diagnostic import DiagnosticResult
from clusterctl.slurm.nodes import NodeState

T0 = 1795305600.0  # 2026-11-22T00:00:00Z
R3 = DiagnosticSpec(("/usr/bin/dcgmi", "diag", "-r", "3", "-j"), 3600.0, "dcgmi")
GATED = EngineSettings(node="node3", resume_when_clean=True, clean_checks=2,
                       diagnostics=Diagnostics(before_return=R3, source="test"))


def drained_at(at: float) -> NodeState:
    reason = DrainReason("ecc-dbe", Action.DRAIN_RESET, utc(at), gpu=3).render()
    return NodeState("node3", "idle", ("DRAIN",), reason, ("gpu",))


IN_SERVICE = NodeState("node3", "idle", (), "", ("gpu",))


def result(outcome: str, at: float, summary: str = "") -> DiagnosticResult:
    return DiagnosticResult("before_return", R3.name, outcome, at, summary=summary)  # type: ignore[arg-type]


def note(state: EngineState) -> str:
    return state_view(state, node="node3", pid=1, started=T0, now=T0, nvml_ok=True, identities={}, gpu_count=8,
                      pending_actions=0, loop_age_s={}, dry_run=False).return_note


def clean(state: EngineState, at: float, node: NodeState, settings: EngineSettings = GATED):
    return step(state, settings, "periodic", [], at, node=node, boot_time=T0 - 3600)


def test_clean_checks_ask_for_the_diagnostic_and_the_node_waits_for_it():
    node = drained_at(T0)
    first = clean(EngineState(), T0 + 10, node)
    second = clean(first.state, T0 + 20, node)
    assert [type(e) for e in second.effects] == [RunDiagnostic]
    assert second.effects[0].level == "before_return" and second.effects[0].spec == R3
    assert note(second.state) == "waiting for diagnostic /usr/bin/dcgmi diag -r 3 -j"
    third = clean(second.state, T0 + 30, node)
    assert third.effects == () and "(running)" in note(third.state)  # asked once, not on every check


def test_a_failed_diagnostic_keeps_the_node_drained_and_says_why():
    node = drained_at(T0)
    state = clean(clean(EngineState(), T0 + 10, node).state, T0 + 20, node).state
    state = diagnosed(state, result("fail", T0 + 900, "failed: Diagnostic gpu3: miscompare"))
    later = clean(state, T0 + 910, node)
    assert later.effects == ()
    assert note(later.state).startswith("diagnostic /usr/bin/dcgmi diag -r 3 -j failed: failed: Diagnostic gpu3: "
                                        "miscompare; next try after ")
    retried = clean(later.state, T0 + 900 + 3600, node)  # an hour later it is tried again
    assert [type(e) for e in retried.effects] == [RunDiagnostic]


def test_a_pass_newer_than_the_drain_returns_the_node():
    node = drained_at(T0)
    state = clean(clean(EngineState(), T0 + 10, node).state, T0 + 20, node).state
    back = clean(diagnosed(state, result("pass", T0 + 900)), T0 + 910, node)
    assert [type(e) for e in back.effects] == [Resume]
    assert note(back.state).startswith("diagnostic /usr/bin/dcgmi diag -r 3 -j passed at ")


def test_a_pass_older_than_the_drain_does_not_count():
    node = drained_at(T0)
    state = diagnosed(EngineState(), result("pass", T0 - 1))  # from before this drain (an earlier repair)
    state = clean(clean(state, T0 + 10, node).state, T0 + 20, node)
    assert [type(e) for e in state.effects] == [RunDiagnostic]


def test_without_a_diagnostic_configured_clean_checks_decide_alone():
    plain = EngineSettings(node="node3", resume_when_clean=True, clean_checks=2)
    node = drained_at(T0)
    second = clean(clean(EngineState(), T0 + 10, node, plain).state, T0 + 20, node, plain)
    assert [type(e) for e in second.effects] == [Resume]


def test_an_admin_s_resume_is_left_alone_and_clears_the_note():
    node = drained_at(T0)
    waiting = clean(clean(EngineState(), T0 + 10, node).state, T0 + 20, node).state
    resumed = clean(waiting, T0 + 30, IN_SERVICE)  # the admin resumed it by hand
    assert resumed.effects == () and note(resumed.state) == ""


# ---- the property --------------------------------------------------------------------------------

EVENTS = st.lists(st.one_of(
    st.tuples(st.just("drain")),
    st.tuples(st.just("clean")),
    st.tuples(st.just("admin-resume")),
    st.tuples(st.just("result"), st.sampled_from(["pass", "fail", "timeout", "error"]),
              st.floats(min_value=-7200, max_value=7200, allow_nan=False)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.integers(min_value=1, max_value=3))
def test_a_node_is_never_resumed_without_a_passed_diagnostic_newer_than_its_drain(events, checks):
    gated = EngineSettings(node="node3", resume_when_clean=True, clean_checks=checks,
                           diagnostics=Diagnostics(before_return=R3, source="test"))
    state, node, now = EngineState(), IN_SERVICE, T0
    drain_at: float | None = None
    last: DiagnosticResult | None = None  # what the daemon last reported, as the test saw it
    for event in events:
        now += 60
        if event[0] == "drain":
            drain_at, node = now, drained_at(now)
        elif event[0] == "admin-resume":
            drain_at, node = None, IN_SERVICE
        elif event[0] == "result":
            last = result(event[1], (drain_at if drain_at is not None else now) + event[2])
            state = diagnosed(state, last)
        else:
            out = clean(state, now, node, gated)
            state = out.state
            if any(isinstance(e, Resume) for e in out.effects):
                assert drain_at is not None and last is not None
                assert last.passed and last.at > drain_at, (last, drain_at)
                drain_at, node = None, IN_SERVICE  # the applier resumed it
