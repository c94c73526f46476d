"""The one drain door (clusterctl/slurm/drains.py): its rules as properties over every owner, node and
share, and the stories of issue 22 on a Slurm node table (tests/fakes.py's FakeNodeTable)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from clusterctl.healthd.drain_requests import decide_apply
from clusterctl.healthd.engine import EngineSettings, EngineState, Resume, resume_allowed, step
from clusterctl.launcher.shared.straggler_actions import StragglerActions, StragglerDoors, srun_gpu_evidence
from clusterctl.records.actions import Action
from clusterctl.records.drain_reason import (
    HEALTHD, STRAGGLER, DrainReason, owner_of, parse_drain_reason,
)
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.healthd_actions import PlannedAction
from clusterctl.records.run_journal import StragglerFound, read_run_journal
from clusterctl.slurm.drains import (
    STRAGGLER_RULES, DrainRequest, DrainRules, SlurmDrains, decide,
)
from clusterctl.slurm.nodes import NodeState, PartitionShare, SlurmNode, parse_partition_share
from tests.fakes import FakeNodeTable

T0 = 1795305600.0
AT = "2026-11-22T00:00:00Z"
FAULT = f"healthd: xid 79 gpu3 (GPU-x) drain-reboot {AT}"
SLOW = f"clusterctl straggler: slow-gpus drain-reset {AT}"
OLD_SLOW = f"healthd: straggler drain-reset {AT}"  # what straggler drains said before they had an owner
ADMIN = "admin: bad fan"
NODES = [f"node{i}" for i in range(1, 11)]  # a 10-node partition


# ---- the decision, as properties ---------------------------------------------------------------

reasons = st.sampled_from([FAULT, SLOW, OLD_SLOW, ADMIN, "", "Not responding", "healthdx: forged"])
node_states = st.builds(
    lambda draining, down, reason: NodeState("node3", "down" if down else "idle", ("DRAIN",) if draining else (),
                                             reason, ("gpu",)),
    st.booleans(), st.booleans(), reasons)
rules = st.one_of(
    st.builds(lambda share, dry, partition: DrainRules(HEALTHD, share, partition, dry, over_down=True),
              st.floats(0, 1), st.booleans(), st.sampled_from(["", "gpu"])),
    st.builds(lambda share, dry: replace(STRAGGLER_RULES, max_share=share, dry_run=dry), st.floats(0, 1), st.booleans()))
shares = st.one_of(st.none(), st.integers(0, 40).flatmap(
    lambda n: st.builds(lambda held: PartitionShare("gpu", n, held), st.integers(0, max(n - 1, 0)))))
requests = st.builds(lambda node, op, reason: DrainRequest(node, op, parse_drain_reason(reason)),
                     st.sampled_from(["node3", "node3", "-x", "n[1-2]", "a,b", ""]),
                     st.sampled_from(["drain", "resume"]), reasons)


def within_cap(rule: DrainRules, share: PartitionShare | None) -> bool:
    if share is None or not share.nodes or rule.max_share >= 1:
        return True
    held = share.drained_by_us
    return (held + 1) / share.nodes <= rule.max_share or (rule.at_least_one and held == 0 and share.nodes > 1)


@given(rules, requests, node_states, shares)
def test_the_door_never_relabels_lifts_or_overfills_what_is_not_its_owners(rule, request, node, share):
    verdict = decide(rule, request, node, share)
    if verdict.call is not None:
        assert request.node == "node3" and not rule.dry_run  # a real node name; nothing in a dry run
    if verdict.call == "drain":
        assert not node.draining  # never over anyone's drain, not even its own twice
        assert owner_of(request.text) == rule.owner  # writes its own owner's reason only
        assert rule.over_down or not node.down
        assert within_cap(rule, share)
    if verdict.call == "resume":
        assert node.drained_by(rule.owner)  # lifts only its own drain
    if node.draining and not node.drained_by(rule.owner):
        assert verdict.call is None


@given(node_states, shares, st.floats(0, 1), st.booleans(), st.sampled_from(["drain", "resume"]),
       st.sampled_from([FAULT, f"healthd: ecc-dbe gpu0 drain-reset {AT}"]))
def test_healthd_decides_its_own_drains_exactly_as_before_the_door(node, share, max_share, dry_run, op, reason):
    """healthd's decide_apply before the door, verbatim, as the reference (for every reason but the
    straggler ones, which it used to count and resume as its own)."""
    settings = EngineSettings(node="node3", breaker_max_share=max_share, dry_run=dry_run, partition="")
    action = PlannedAction("a", op, reason, T0)

    def before() -> tuple[str, str | None]:
        ours = node.draining and node.reason.startswith("healthd:")
        if op == "resume":
            return ("not-ours", None) if not ours else ("dry-run", None) if dry_run else ("resumed", "resume")
        if node.draining and not ours:
            return "kept-other-drain", None
        if ours:
            return "already-drained", None
        if max_share < 1 and share is not None and share.nodes \
                and (share.drained_by_us + 1) / share.nodes > max_share:
            return "breaker-open", None
        return ("dry-run", None) if dry_run else ("drained", "drain")

    if node.reason.startswith(("healthd: straggler", "clusterctl straggler:")):
        return
    decision = decide_apply(settings, action, node, share, T0)
    assert (decision.result, decision.call) == before()
    assert (decision.alert is not None) == (decision.result == "breaker-open")


@given(st.sampled_from([HEALTHD, STRAGGLER]), st.sampled_from(["xid", "slow-gpus", "ecc-dbe"]),
       st.sampled_from(list(Action)), st.one_of(st.none(), st.integers(0, 7)))
def test_every_owners_reason_reads_back_as_that_owners(owner, kind, action, gpu):
    reason = DrainReason(kind, action, AT, gpu=gpu, owner=owner)
    assert parse_drain_reason(reason.render()) == reason
    assert owner_of(reason.render()) is owner


def test_old_reasons_still_read_straggler_ones_are_the_stragglers():
    assert parse_drain_reason(FAULT) == DrainReason("xid", Action.DRAIN_REBOOT, AT, xid=79, gpu=3, uuid="GPU-x")
    assert owner_of(OLD_SLOW) is STRAGGLER and parse_drain_reason(OLD_SLOW).owner is STRAGGLER
    assert owner_of(ADMIN) is None and owner_of("healthdx: forged") is None


# ---- healthd: a straggler drain is not its own -------------------------------------------------

def slow(name: str, reason: str = SLOW) -> NodeState:
    return NodeState(name, "idle", ("DRAIN",), reason, ("gpu",))


def test_a_straggler_drain_takes_no_slot_of_healthds_breaker():
    """Issue 22: one straggler drain in a 10-node partition made healthd refuse a real Xid 79 drain."""
    for reason in (SLOW, OLD_SLOW):
        partition = [slow("node1", reason)] + [NodeState(n, "idle", (), "", ("gpu",)) for n in NODES[1:]]
        share = PartitionShare.of("gpu", partition)
        assert share.drained_by_us == 0
        sinfo = parse_partition_share(f"1|drained|{reason}\n9|idle|none\n", "gpu")
        assert (sinfo.nodes, sinfo.drained_by_us) == (10, 0)
        settings = EngineSettings(node="node3", breaker_max_share=0.1)
        action = PlannedAction("d", "drain", FAULT, T0)
        assert decide_apply(settings, action, partition[2], share, T0).result == "drained"


def test_healthd_never_resumes_a_straggler_drain_nor_relabels_it():
    settings = EngineSettings(node="node3", resume_when_clean=True, clean_checks=1)
    for reason in (SLOW, OLD_SLOW):
        node = slow("node3", reason)
        assert not resume_allowed(reason, boot_time=T0 + 60)
        assert not [e for e in step(EngineState(), settings, "periodic", [], T0, node=node).effects
                    if isinstance(e, Resume)]
        assert decide_apply(settings, PlannedAction("d", "drain", FAULT, T0), node, None, T0).result \
            == "kept-other-drain"


# ---- the straggler verdicts at the door --------------------------------------------------------

THROTTLED = GpuEvidence("node2", T0, (GpuReading(3, "GPU-3", 0x60, 792, 1980, 88),))


def straggler_actions(tmp_path: Path, table: FakeNodeTable, said: list[str]) -> StragglerActions:
    (tmp_path / "jobs" / "7").mkdir(parents=True, exist_ok=True)
    doors = StragglerDoors(lambda: T0, said.append, lambda node, env: THROTTLED, SlurmDrains(runner=table).drain)
    return StragglerActions(tmp_path, tmp_path / "jobs" / "7", "7", "exclude", 1.0, doors)


def found(node: str) -> StragglerFound:
    return StragglerFound(at=0.0, job_id="", node=node, ranks=(8,), ratio=2.5, seconds=0.25, reference=0.1, steps=30,
                          since_step=11, lost_s=3.0, evidence=("2.5x slower",))


def test_a_straggler_verdict_never_relabels_an_admins_drain(tmp_path):
    table = FakeNodeTable(NODES, drained={"node2": ADMIN})
    straggler_actions(tmp_path, table, []).act(found("node2"), {})
    assert table.updates() == [] and table.reasons["node2"] == ADMIN
    [event] = read_run_journal(tmp_path / "journal.jsonl").events
    assert event.drain == f"not drained: kept another drain ({ADMIN})"


def test_a_straggler_verdict_never_relabels_healthds_drain_nor_a_node_slurm_took_down(tmp_path):
    table = FakeNodeTable(NODES, drained={"node2": FAULT}, down=["node4"])
    actions = straggler_actions(tmp_path, table, [])
    actions.act(found("node2"), {})
    actions.act(found("node4"), {})
    assert table.updates() == [] and table.reasons == {"node2": FAULT}


def test_straggler_verdicts_keep_to_their_own_share_of_the_partition(tmp_path):
    """10% of the partition, at least one node; healthd's drains neither count against it nor it against healthd."""
    table = FakeNodeTable(NODES, drained={"node1": SLOW, "node9": FAULT, "node10": FAULT})
    said: list[str] = []
    straggler_actions(tmp_path, table, said).act(found("node2"), {})
    assert table.updates() == []
    [event] = read_run_journal(tmp_path / "journal.jsonl").events
    assert event.drain == ("not drained: share cap reached (1 of 10 nodes in gpu already drained by straggler "
                           "verdicts; draining node2 would exceed 10%)")
    small = FakeNodeTable(NODES[:4], drained={"node4": FAULT})  # one node of a small partition may always go
    straggler_actions(tmp_path / "small", small, said).act(found("node2"), {})
    assert small.drains == [("node2", "clusterctl straggler: slow-gpus drain-reset 2026-11-22T00:00:00Z")]
    straggler_actions(tmp_path / "again", small, said).act(found("node3"), {})
    assert len(small.drains) == 1  # but only one


def test_a_straggler_verdict_cannot_write_healthds_reason():
    table = FakeNodeTable(NODES)
    done = SlurmDrains(runner=table).drain("node2", DrainReason("xid", Action.DRAIN_RMA, AT, xid=79))
    assert done.verdict.result == "not-owners-reason" and table.updates() == []


def test_a_node_name_from_a_progress_file_never_reaches_srun_or_scontrol(tmp_path):
    table = FakeNodeTable(NODES)
    said: list[str] = []
    actions = straggler_actions(tmp_path, table, said)
    for name in ("--help", "node[1-2]", "node1,node2", "-w"):
        assert actions.act(found(name), {}) is None
        assert SlurmDrains(runner=table).drain(name, DrainReason("slow-gpus", Action.DRAIN_RESET, AT,
                                                                 owner=STRAGGLER)).verdict.result == "bad-node-name"
        assert srun_gpu_evidence("/nonexistent/python")(name, {}).startswith("not asked: ")
    assert table.calls == [] and not (tmp_path / "journal.jsonl").exists()
    assert said[0].startswith("straggler ignored: '--help' is not a node name")


def test_a_slow_node_where_the_job_has_no_gpus_reads_none_of_the_others_and_is_not_drained(tmp_path):
    """The evidence step is given the job's GPUs on the node (none here) and reads only those: the GPU
    lists of the caller's own step (the batch host's, a standby agent's node's) never reach it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"  # like srun: the caller's environment goes on to the step; options dropped
    srun.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    table = FakeNodeTable(NODES)
    said: list[str] = []
    doors = StragglerDoors(lambda: T0, said.append, srun_gpu_evidence(sys.executable), SlurmDrains(runner=table).drain)
    actions = StragglerActions(tmp_path, tmp_path / "jobs" / "7", "7", "exclude", 1.0, doors)
    caller = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
              "SLURM_STEP_GPUS": "0,1", "SLURM_JOB_GPUS": "0,1"}
    actions.act(found("node2"), caller)
    [event] = read_run_journal(tmp_path / "journal.jsonl").events
    assert event.hardware == () and table.drains == []
    assert event.drain == "not drained: the GPUs' own evidence does not explain the slowdown; avoided by this run only"
    assert event.evidence[-1] == ("GPU evidence: read no GPU: SLURM_STEP_GPUS is not set (no GPUs of this job on this "
                                  "node); SLURM_STEP_GPUS is not set: Slurm names no GPU of this job on this node, so "
                                  "no GPU was read (the other GPUs are other jobs')"), event


def test_healthd_still_drains_a_node_slurm_took_down_as_before():
    down = NodeState("node3", "down", ("NOT_RESPONDING",), "Not responding", ("gpu",))
    assert decide_apply(EngineSettings(node="node3"), PlannedAction("d", "drain", FAULT, T0), down, None, T0).result \
        == "drained"
    table = FakeNodeTable(NODES, down=["node3"])
    assert SlurmNode("node3", table).state().down
