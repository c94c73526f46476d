"""The agent's side of multi-level checkpoints, as stories: what the nodes report they hold, the plan the
agent makes from it when nodes are lost or resumes fail, the step's tier index and settings, and what a
job leaves for the next one (its inventory, complete.json on shared storage)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from clusterctl.launcher.job.checkpoint_plan import INVENTORY_EVERY, TierPlanner, run_key
from clusterctl.launcher.pure.spec import JobSpec, parse_spec
from clusterctl.launcher.shared.checkpoint_inventory import (
    INVENTORY_KIND, INVENTORY_NAME, INVENTORY_VERSION, FlushedCheckpoint, inventory_text, read_complete, read_inventory,
    step_dir,
)
from clusterctl.launcher.shared.checkpoints import find_checkpoints
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, CopyRefusals, HeldCopy
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.resume_failure import BadCopy, ResumeFailure, write_resume_failure
from clusterctl.records.tier_index import read_tier_slot
from clusterctl.records.versioned import RecordError

NODES = ("node1", "node2", "node3")
T0 = 1_795_305_600.0
SPEC = """\
[job]
name = "llm"
nodes = 3

[launch]
command = ["python3", "train.py"]

[checkpoint]
dir = "{run_dir}/ckpt"
tiers = true
keep = 3
flush_every_steps = 10
local_budget_gb = 2.5
shared_mb_per_s = 400
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def spec(text: str = SPEC) -> JobSpec:
    return parse_spec(text, "job.toml", base_dir=Path("/base"))


def planner(run_dir: Path, job: str = "100", text: str = SPEC, said: list[str] | None = None,
            clock: Clock | None = None) -> TierPlanner:
    job_dir = run_dir / "jobs" / job
    job_dir.mkdir(parents=True, exist_ok=True)
    return TierPlanner(run_dir, job_dir, spec(text), {"CLUSTERCTL_NODE_TMP": "/local/tmp"},
                       (said if said is not None else []).append, clock or Clock())


def saved(node: str, step: int, *, buddy_of: str | None = None, flushed: bool = False) -> tuple[HeldCopy, ...]:
    """What `node` holds of checkpoint `step`: its own part, the part of the node whose buddy it is, and
    with `flushed` its own part on shared storage too.  Slot s is node(s+1)."""
    slot = NODES.index(node)
    copies = [HeldCopy(step, node, "local", slot, 3, T0 + step, 2.0)]
    if buddy_of is not None:
        copies.append(HeldCopy(step, buddy_of, "buddy", NODES.index(buddy_of), 3, T0 + step + 1, 2.0))
    if flushed:
        copies.append(HeldCopy(step, node, "shared", slot, 3, T0 + step + 5, 2.0))
    return tuple(copies)


# buddy_map over three nodes under one leaf: node1 → node2 → node3 → node1 (each keeps the previous one's part)
KEEPS = {"node1": "node3", "node2": "node1", "node3": "node2"}


def holdings(*steps: int, flushed: tuple[int, ...] = ()) -> dict[str, CheckpointHoldings]:
    return {node: CheckpointHoldings(node, tuple(c for step in steps for c in saved(
        node, step, buddy_of=KEEPS[node], flushed=step in flushed)), T0 + max(steps)) for node in NODES}


# ---- a node lost: the spare fetches its part from the buddy ---------------------------------------------

def test_a_lost_node_s_part_is_fetched_by_the_spare_from_its_buddy_as_the_tier_index_says(tmp_path):
    said: list[str] = []
    tiers = planner(tmp_path / "run", said=said)
    tiers.observe(holdings(10, 20))
    checkpoint = tiers.resume_point(["node1", "node3", "node4"])  # node2 lost, node4 the spare
    assert checkpoint is not None and checkpoint.step == 20
    assert said[-1] == "resuming from step 20: 2 node(s) from their own copies, 1 node(s) from a buddy's copy " \
                       "(node2's on node3)"
    launch = tmp_path / "run" / "jobs" / "100" / "restart-1"
    launch.mkdir()
    env = tiers.launch_env(launch, ["node1", "node4", "node3"], {}, avoid_port=29500)
    settings = CheckpointSettings.from_env(env)
    assert settings is not None and settings.resume_step == 20 and settings.tier_index == str(launch / "tiers.idx")
    step, slots, spare = read_tier_slot(Path(settings.tier_index), 1)
    assert (step, slots) == (20, 3)
    assert (spare.node, spare.tier, spare.of_node, spare.held_on) == ("node4", "buddy", "node2", "node3")
    own = read_tier_slot(Path(settings.tier_index), 0)[2]
    assert (own.node, own.tier, own.of_node, own.held_on) == ("node1", "local", "node1", "node1")
    assert {own.buddy, spare.buddy} <= {"node1", "node3", "node4"} and own.buddy != "node1"


def test_the_step_s_settings_follow_the_spec_and_name_the_holdings_file_the_reporter_reads(tmp_path):
    tiers = planner(tmp_path / "run")
    assert tiers.resume_point(NODES) is None  # nothing saved yet: a fresh start, and the index says so
    env = tiers.launch_env(tmp_path / "run" / "jobs" / "100", list(NODES), {"node1": "a", "node2": "a", "node3": "b"},
                           avoid_port=29500)
    settings = CheckpointSettings.from_env(env)
    assert settings is not None
    assert (settings.run_key, settings.local_base, settings.shared_dir) == (
        run_key(tmp_path / "run"), "/local/tmp", str(tmp_path / "run" / "ckpt"))
    assert (settings.keep, settings.flush_every_steps, settings.flush_at_end, settings.local_budget_bytes,
            settings.shared_bytes_per_second, settings.resume_step) == (3, 10, True, 2_500_000_000, 400e6, None)
    assert 20000 <= settings.port < 32768 and settings.port != 29500
    step, _, first = read_tier_slot(Path(settings.tier_index), 0)
    assert step is None and first.tier == "-" and first.buddy == "node3"  # across the leaves
    local = planner(tmp_path / "run", text=SPEC.replace("tiers = true", 'tiers = true\nlocal_dir = "/nvme"'))
    local.resume_point(NODES)
    assert json.loads(local.launch_env(tmp_path, list(NODES), {})["CLUSTERCTL_CHECKPOINT"])["local_base"] == "/nvme"


# ---- a resume that fails: the next tier, then the last flushed checkpoint ----------------------------

def test_a_copy_a_resume_found_corrupted_is_passed_over_for_the_next_tier(tmp_path):
    tiers = planner(tmp_path / "run")
    tiers.observe(holdings(20, flushed=(20,)))
    assert tiers.resume_point(["node1", "node3", "node4"]).step == 20
    launch = tmp_path / "run" / "jobs" / "100" / "restart-1"
    tiers.launch_env(launch, ["node1", "node4", "node3"], {})
    assert read_tier_slot(launch / "tiers.idx", 1)[2].tier == "buddy"
    write_resume_failure(launch, ResumeFailure("node4", 20, "no copy of slot 1 verified", (
        BadCopy(20, "node2", "buddy", "node3", "fails its checksum (shard rank-1.json)"),)))
    said = tiers.resume_failed(launch)
    assert said == ["node4 could not load checkpoint 20: no copy of slot 1 verified"]
    assert tiers.resume_point(["node1", "node3", "node4"]).step == 20  # the same checkpoint, another tier
    again = tmp_path / "run" / "jobs" / "100" / "restart-2"
    tiers.launch_env(again, ["node1", "node4", "node3"], {})
    spare = read_tier_slot(again / "tiers.idx", 1)[2]
    assert (spare.tier, spare.of_node, spare.held_on) == ("shared", "node2", "-")


def test_two_failed_resumes_of_a_checkpoint_fall_back_to_the_last_one_flushed_whole(tmp_path):
    said: list[str] = []
    tiers = planner(tmp_path / "run", said=said)
    tiers.observe(holdings(10, 20, flushed=(10,)))
    flushed = step_dir(tmp_path / "run" / "ckpt", 10) / "complete.json"
    assert read_complete(flushed) == FlushedCheckpoint(10, NODES, 2.0)
    assert not (step_dir(tmp_path / "run" / "ckpt", 20) / "complete.json").exists()
    # what the supervisor's validator sees: step 10, complete
    assert [c.step for c in find_checkpoints(tmp_path / "run" / "ckpt", "tiers")[0]] == [10]
    for attempt in (1, 2):
        assert tiers.resume_point(NODES).step == 20
        launch = tmp_path / "run" / "jobs" / "100" / f"restart-{attempt}"
        write_resume_failure(launch, ResumeFailure("node2", 20, "fetching from node1 timed out"))
        assert tiers.resume_failed(launch)
    checkpoint = tiers.resume_point(NODES)
    assert checkpoint is not None and checkpoint.step == 10
    assert "resuming from step 20 failed 2 times: only a checkpoint flushed to shared storage is taken" in said
    assert said[-1] == "resuming from step 10: 3 node(s) from shared storage"
    assert tiers.resume_failed(tmp_path / "run" / "jobs" / "100" / "restart-9") == []  # no failure records: none


def test_a_checkpoint_flushed_whole_is_marked_once_and_a_slot_not_yet_flushed_is_not(tmp_path):
    tiers = planner(tmp_path / "run")
    partly = holdings(30)
    partly["node1"] = CheckpointHoldings("node1", saved("node1", 30, buddy_of="node3", flushed=True), T0 + 40)
    tiers.observe(partly)
    marker = step_dir(tmp_path / "run" / "ckpt", 30) / "complete.json"
    assert not marker.exists()
    tiers.observe(holdings(30, flushed=(30,)))
    first = marker.stat().st_mtime_ns
    tiers.observe({**holdings(30, flushed=(30,)), "node2": CheckpointHoldings("node2", (), T0 + 99)})
    assert marker.stat().st_mtime_ns == first


def test_complete_json_records_the_slowest_slots_save_and_the_validator_gives_it_as_the_checkpoints_cost(tmp_path):
    tiers = planner(tmp_path / "run")
    held = holdings(30, flushed=(30,))
    slow = tuple(replace(c, save_seconds=3.5) if c.tier == "shared" else c for c in held["node2"].copies)
    tiers.observe({**held, "node2": CheckpointHoldings("node2", slow, T0 + 40)})
    marker = step_dir(tmp_path / "run" / "ckpt", 30) / "complete.json"
    assert read_complete(marker) == FlushedCheckpoint(30, NODES, 3.5)
    [checkpoint] = find_checkpoints(tmp_path / "run" / "ckpt", "tiers")[0]
    assert (checkpoint.step, checkpoint.save_seconds) == (30, 3.5)
    # an older agent's marker (version 1) is still read, without a cost; a version 2 one must say it (or null)
    body = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: v for k, v in body.items() if k != "save_seconds"} | {"version": 1}))
    assert read_complete(marker) == FlushedCheckpoint(30, NODES)
    marker.write_text(json.dumps({k: v for k, v in body.items() if k != "save_seconds"}))
    with pytest.raises(RecordError, match="missing field `save_seconds`"):
        read_complete(marker)
    marker.write_text(json.dumps({**body, "version": 1}))
    with pytest.raises(RecordError, match="unknown field `save_seconds`"):
        read_complete(marker)
    marker.write_text(json.dumps({**body, "save_seconds": -2}))
    with pytest.raises(RecordError, match="field `save_seconds` is -2"):
        read_complete(marker)


# ---- what a job leaves for the next: its inventory ------------------------------------------------------

def test_the_inventory_is_written_per_change_at_most_every_30_s_and_after_a_plan_never_before_it(tmp_path):
    clock = Clock()
    tiers = planner(tmp_path / "run", clock=clock)
    path = tmp_path / "run" / "jobs" / "100" / INVENTORY_NAME
    tiers.observe(holdings(10))
    tiers.record_due()
    assert read_inventory(path) == holdings(10)
    written = path.stat().st_mtime_ns
    clock.t += 1
    tiers.observe(holdings(10))  # unchanged: nothing written
    tiers.record_due()
    tiers.observe(holdings(10, 20))  # changed within INVENTORY_EVERY: kept for later
    tiers.record_due()
    assert path.stat().st_mtime_ns == written and read_inventory(path) == holdings(10)
    clock.t += INVENTORY_EVERY
    tiers.record_due()
    assert read_inventory(path) == holdings(10, 20)
    clock.t += 1
    tiers.observe(holdings(10, 20, 30))
    assert tiers.resume_point(NODES).step == 30  # planned from what was observed...
    launch = tmp_path / "run" / "jobs" / "100" / "restart-1"
    tiers.launch_env(launch, list(NODES), {})
    assert read_inventory(path) == holdings(10, 20)  # ...without writing it on the way to the new step
    tiers.record_pending()  # the step launched (or the agent ending): what is pending is written at once
    assert read_inventory(path) == holdings(10, 20, 30)
    written = path.stat().st_mtime_ns
    tiers.record_pending()
    assert path.stat().st_mtime_ns == written


def test_what_a_nodes_copy_server_refused_never_rewrites_the_inventory_on_shared_storage(tmp_path):
    clock = Clock()
    tiers = planner(tmp_path / "run", clock=clock)
    path = tmp_path / "run" / "jobs" / "100" / INVENTORY_NAME
    tiers.observe(holdings(10))
    tiers.record_due()
    written = path.stat().st_mtime_ns
    for count in range(1, 5):  # a stranger keeps knocking on every node's copy port for minutes
        clock.t += INVENTORY_EVERY
        tiers.observe({node: replace(held, copies_refused=CopyRefusals(1.0, (("wrong key", count),)))
                       for node, held in holdings(10).items()})
        tiers.record_due()
    tiers.record_pending()
    assert path.stat().st_mtime_ns == written and read_inventory(path) == holdings(10)


def test_the_inventory_re_encodes_only_the_nodes_whose_holdings_changed_and_reads_the_same(tmp_path):
    def whole(held: dict[str, CheckpointHoldings]) -> str:  # the record encoded in one go
        return json.dumps({"kind": INVENTORY_KIND, "version": INVENTORY_VERSION,
                           "nodes": [held[n].to_json() for n in sorted(held)]}, sort_keys=True,
                          separators=(",", ":")) + "\n"
    fragments: dict[str, tuple[CheckpointHoldings, str]] = {}
    first = holdings(10)
    assert inventory_text(first, fragments) == whole(first) == inventory_text(first)
    kept = fragments["node1"]
    later = {**first, "node2": holdings(10, 20)["node2"]}
    assert inventory_text(later, fragments) == whole(later)
    assert fragments["node1"] is kept and fragments["node2"][0] is later["node2"]
    del later["node3"]
    assert inventory_text(later, fragments) == whole(later) and "node3" not in fragments


def test_a_plan_takes_the_copies_observed_and_the_ones_a_previous_job_recorded(tmp_path):
    first = planner(tmp_path / "run", job="100")
    first.observe(holdings(10, 20))
    first.record_pending()  # as its agent ends
    second = planner(tmp_path / "run", job="101")
    second.load_previous()  # recorded, never observed by this planner: converted when planning
    second.observe({"node1": holdings(10, 20, 30)["node1"]})
    assert second.resume_point(NODES) is not None and second.plan is not None and second.plan.step == 20
    assert {s.node: s.tier for s in second.plan.sources} == {node: "local" for node in NODES}


def test_a_resubmitted_job_resumes_from_the_copies_its_predecessor_recorded(tmp_path):
    first = planner(tmp_path / "run", job="100")
    first.observe(holdings(10, 20))
    first.record_pending()  # as its agent ends
    second = planner(tmp_path / "run", job="101")
    second.load_previous()
    checkpoint = second.resume_point(["node3", "node1", "node5"])  # node2 not given to this job
    assert checkpoint is not None and checkpoint.step == 20
    assert {s.node: (s.tier, s.held_on) for s in second.plan.sources}["node2"] == ("buddy", "node3")


def test_a_damaged_inventory_is_said_in_one_line_and_ignored(tmp_path):
    first = planner(tmp_path / "run", job="100")
    first.observe(holdings(10, flushed=(10,)))
    first.record_pending()
    (tmp_path / "run" / "jobs" / "100" / INVENTORY_NAME).write_text('{"kind": "checkpoint-inventory", "version"')
    said: list[str] = []
    second = planner(tmp_path / "run", job="101", said=said)
    second.load_previous()
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("ignoring the checkpoint inventory") and INVENTORY_NAME in said[0]
    assert second.resume_point(NODES).step == 10  # from shared storage's complete.json alone
    assert said[-1] == "resuming from step 10: 3 node(s) from shared storage"


def test_a_damaged_complete_marker_is_said_and_not_taken(tmp_path):
    said: list[str] = []
    tiers = planner(tmp_path / "run", said=said)
    marker = step_dir(tmp_path / "run" / "ckpt", 10) / "complete.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert tiers.resume_point(NODES) is None
    assert any(line.startswith(f"not taking {marker}") for line in said)


def test_tiers_need_a_shared_directory(tmp_path):
    with pytest.raises(ValueError, match=r"\[checkpoint\] dir"):
        TierPlanner(tmp_path, tmp_path, spec(SPEC.replace('dir = "{run_dir}/ckpt"\ntiers = true\n', "")), {},
                    print)
