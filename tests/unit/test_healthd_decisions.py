"""healthd's decisions, through the engine's public step: drain once, storms, sticky findings,
resume with evidence, admin drains, the breaker, repeated application Xids across jobs."""

from __future__ import annotations

from dataclasses import replace

from clusterctl.healthd.drain_requests import decide_apply, planned_request
from clusterctl.healthd.engine import (
    Drain, EngineSettings, EngineState, RaiseAlert, Remember, Resume, applied, blocking_in_state, needs_jobs,
    resume_allowed, state_view, step,
)
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.policy import PolicyConfig
from clusterctl.records.healthd_actions import PlannedAction
from clusterctl.slurm.nodes import NodeState, PartitionShare

SETTINGS = EngineSettings(node="node3", resume_when_clean=True, clean_checks=2)
T0 = 1795305600.0  # 2026-11-22T00:00:00Z


def node(reason: str = "", name: str = "node3") -> NodeState:
    return NodeState(name, "idle", ("DRAIN",) if reason else (), reason, ("gpu",))


def lost(at: float = T0) -> Finding:
    return Finding("gpu-lost", "nvml-event", at, gpu=3, uuid="GPU-3")


def xid(number: int, at: float = T0, gpu: int = 3, source: str = "nvml-event", jobs: tuple[str, ...] = ()) -> Finding:
    return Finding("xid", source, at, gpu=gpu, uuid=f"GPU-{gpu}", xid=number, job_ids=jobs)


def drains(result) -> list[str]:
    return [e.planned.reason for e in result.effects if isinstance(e, Drain)]


def view(state: EngineState):
    return state_view(state, node="node3", pid=1, started=T0, now=T0, nvml_ok=True, identities={}, gpu_count=8,
                      pending_actions=0, loop_age_s={}, dry_run=False)


def test_a_fault_seen_by_two_sources_drains_once_with_an_owned_reason():
    first = step(EngineState(), SETTINGS, "nvml-event", [lost()], T0)
    second = step(first.state, SETTINGS, "kmsg", [xid(79, T0 + 0.1, source="kmsg")], T0 + 0.1)
    assert drains(first) == ["healthd: gpu-lost gpu3 (GPU-3) drain-reboot 2026-11-22T00:00:00Z"]
    assert drains(second) == []  # the first drain is still in flight


def test_a_storm_of_one_xid_is_judged_once_per_window():
    storm = [xid(48, T0 + i) for i in range(100)]
    result = step(EngineState(), SETTINGS, "nvml-event", storm, T0 + 100)
    assert len(result.judged) == 1
    later = step(result.state, SETTINGS, "nvml-event", [xid(48, T0 + 301)], T0 + 301)
    assert len(later.judged) == 1  # past the 300 s window it is a new fault


def test_warnings_and_app_faults_never_drain():
    state = EngineState()
    for source, finding in (("nvml-event", xid(13, gpu=1, jobs=("4242",))), ("kmsg", xid(45, source="kmsg")),
                            ("periodic", Finding("remap-pending", "periodic", T0, gpu=2))):
        result = step(state, SETTINGS, source, [finding], T0)
        assert drains(result) == []
        state = result.state


def test_an_app_xid_repeated_on_one_gpu_across_jobs_drains():
    assert needs_jobs(EngineState(), SETTINGS, xid(13)) and not needs_jobs(EngineState(), SETTINGS, xid(79))
    first = step(EngineState(), SETTINGS, "nvml-event", [xid(13, jobs=("101",))], T0)
    assert [type(e) for e in first.effects] == [Remember] and first.effects[0].sighting.job_ids == ("101",)
    second = step(first.state, SETTINGS, "kmsg", [xid(43, T0 + 60, source="kmsg", jobs=("102",))], T0 + 60)
    assert drains(second) == ["healthd: xid 43 gpu3 (GPU-3) drain-reset 2026-11-22T00:01:00Z"]


def test_an_app_xid_repeat_counts_across_a_restart_through_the_xid_history():
    from clusterctl.healthd.engine import restore

    first = step(EngineState(), SETTINGS, "nvml-event", [xid(13, jobs=("101",))], T0)
    restarted = restore([e.sighting for e in first.effects if isinstance(e, Remember)])
    assert drains(step(restarted, SETTINGS, "nvml-event", [xid(13, T0 + 60, jobs=("102",))], T0 + 60))


def test_findings_of_a_periodic_check_hold_until_a_check_no_longer_sees_them():
    pending = step(EngineState(), SETTINGS, "periodic", [Finding("remap-pending", "periodic", T0, gpu=1)], T0)
    assert next(g for g in view(pending.state).gpus if g.index == 1).verdict is Action.RESET_AT_IDLE
    assert blocking_in_state(view(pending.state), [1])  # the prolog refuses a job on that GPU
    clean = step(pending.state, SETTINGS, "periodic", [], T0 + 15)
    assert view(clean.state).verdict is Action.IGNORE


def test_a_node_we_drained_is_not_drained_again_by_each_periodic_check():
    ours = node("healthd: ecc-dbe gpu1 drain-reset 2026-11-22T00:00:00Z")
    result = step(EngineState(), SETTINGS, "periodic", [Finding("ecc-dbe", "periodic", T0, gpu=1)], T0, node=ours)
    assert drains(result) == []


def test_our_reset_class_drain_is_resumed_after_enough_clean_checks():
    state = EngineState()
    ours = node("healthd: ecc-dbe gpu1 drain-reset 2026-11-22T00:00:00Z")
    first = step(state, SETTINGS, "periodic", [], T0, node=ours)
    second = step(first.state, SETTINGS, "periodic", [], T0 + 15, node=ours)
    assert first.effects == ()
    assert [(type(e), e.planned.reason) for e in second.effects] == [(Resume, ours.reason)]


def test_an_rma_drain_is_never_resumed():
    state = EngineState()
    rma = node("healthd: remap-failure gpu2 drain-rma 2026-11-22T00:00:00Z")
    for i in range(5):
        result = step(state, SETTINGS, "periodic", [], T0 + 15 * i, node=rma)
        assert result.effects == ()
        state = result.state


def test_a_reboot_class_drain_is_resumed_only_after_a_reboot():
    reboot = "healthd: xid 79 gpu3 (GPU-x) drain-reboot 2026-11-22T00:00:00Z"
    assert not resume_allowed(reboot, boot_time=T0 - 60)
    assert resume_allowed(reboot, boot_time=T0 + 60)


def test_an_admin_drain_is_never_overwritten_nor_resumed():
    admin = node("admin: bad fan")
    drain = PlannedAction("d1", "drain", "healthd: gpu-lost gpu3 drain-reboot 2026-11-22T00:00:00Z", T0)
    assert decide_apply(SETTINGS, drain, admin, None, T0).result == "kept-other-drain"
    assert decide_apply(SETTINGS, replace(drain, op="resume"), admin, None, T0).result == "not-ours"
    assert not resume_allowed(admin.reason, boot_time=T0 + 60)


def test_the_breaker_alerts_instead_of_draining_past_its_share():
    partition = [node("healthd: ecc-dbe gpu0 drain-reset 2026-11-22T00:00:00Z", "n0"), node(name="n1"),
                 node(name="n2"), node()]
    drain = PlannedAction("d1", "drain", "healthd: gpu-lost gpu3 drain-reboot 2026-11-22T00:00:00Z", T0)
    decision = decide_apply(SETTINGS, drain, node(), PartitionShare.of("gpu", partition), T0)
    assert (decision.result, decision.call) == ("breaker-open", None)
    after = applied(EngineState(), drain, decision, T0)
    assert [type(e) for e in after.effects] == [RaiseAlert]
    assert after.state.alerts[0].detail == ("1 of 4 nodes in gpu already drained by healthd; "
                                            "draining node3 would exceed 10%")


def test_dry_run_decides_but_calls_nothing():
    drain = PlannedAction("d1", "drain", "healthd: gpu-lost gpu3 drain-reboot 2026-11-22T00:00:00Z", T0)
    decision = decide_apply(replace(SETTINGS, dry_run=True), drain, node(), None, T0)
    assert (decision.result, decision.call) == ("dry-run", None)


def test_once_healthd_acted_on_a_fault_the_prolog_leaves_it_to_slurm():
    result = step(EngineState(), SETTINGS, "nvml-event", [lost()], T0)
    assert blocking_in_state(view(result.state), [3])
    drain = result.effects[0].planned
    done = applied(result.state, drain, decide_apply(SETTINGS, drain, node(), None, T0), T0)
    assert blocking_in_state(view(done.state), [3]) == []
    assert not done.state.drain_in_flight


def test_a_node_back_in_service_treats_the_same_fault_again_as_new():
    first = step(EngineState(), SETTINGS, "nvml-event", [xid(48)], T0)
    drain = first.effects[-1].planned
    state = applied(first.state, drain, decide_apply(SETTINGS, drain, node(), None, T0), T0).state
    resumed = step(state, SETTINGS, "periodic", [], T0 + 100, node=node())  # an admin resumed the node
    again = step(resumed.state, SETTINGS, "nvml-event", [xid(48, T0 + 101)], T0 + 101)
    assert len(again.judged) == 1 and drains(again), "not suppressed as part of the old storm"


def gpu_verdict(state: EngineState, index: int) -> Action:
    return next(g.verdict for g in view(state).gpus if g.index == index)


def test_a_node_view_from_before_our_drain_landed_does_not_end_the_fault():
    first = step(EngineState(), SETTINGS, "nvml-event", [xid(48)], T0)
    drain = first.effects[-1].planned
    stale = step(first.state, SETTINGS, "periodic", [], T0 + 2, node=node(), node_at=T0 + 0.2).state
    done = applied(stale, drain, decide_apply(SETTINGS, drain, node(), None, T0), T0 + 2.5).state
    after = step(done, SETTINGS, "nvml-event", [], T0 + 3).state
    assert gpu_verdict(after, 3) is Action.DRAIN_RESET


def test_a_fault_is_over_once_slurm_shows_the_node_back_in_service():
    first = step(EngineState(), SETTINGS, "nvml-event", [xid(48)], T0)
    drain = first.effects[-1].planned
    done = applied(first.state, drain, decide_apply(SETTINGS, drain, node(), None, T0), T0 + 0.5).state
    resumed = step(done, SETTINGS, "periodic", [], T0 + 60, node=node()).state  # an admin resumed it
    assert gpu_verdict(resumed, 3) is Action.IGNORE


def test_a_promoted_xid_drains_as_configured():
    settings = replace(SETTINGS, policy=PolicyConfig({9999: Action.DRAIN_RESET}))
    assert drains(step(EngineState(), settings, "kmsg", [xid(9999, source="kmsg")], T0))


def test_a_journaled_reason_the_parser_cannot_read_back_is_still_drained_as_written():
    # A GPU UUID from the driver with a space in it, say: healthd's own reason all the same.
    odd = "healthd: gpu-lost gpu3 (GPU x) drain-reboot 2026-11-22T00:00:00Z"
    drain = PlannedAction("d1", "drain", odd, T0)
    assert decide_apply(SETTINGS, drain, node(), None, T0).result == "drained"
    assert planned_request(SETTINGS, drain).reason.render() == odd  # what Slurm is sent, verbatim
