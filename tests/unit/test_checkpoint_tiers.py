"""Multi-level checkpoints: which node keeps whose copy, and where a resume loads each node's shards
from when nodes are gone, copies fail their checksums or resumes failed before."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.launcher.pure.checkpoint_tiers import (
    FAILED_RESUMES_BEFORE_FALLBACK, CopyCheck, FlushedCheckpoint, ResumeFacts, flushed_whole, SavedCheckpoint, buddy_map, copy_key, plan_resume,
    SlotSource, nodes_for_map, plan_resume_from_copies, resume_facts, resume_said, resumed_event, resumed_text, slot_sources)
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy, LastResume
from clusterctl.records.checkpoint_manifest import CheckpointManifest, Shard

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODES = ("node1", "node2", "node3", "node4")
CHECKSUM_FAILS = "fails its checksum (shard 7.distcp)"


def copy(step: int, of_node: str, tier: str, held_on: str | None = None, problem: str = "") -> CopyCheck:
    held_on = of_node if tier == "local" else held_on
    shards = (Shard("7.distcp", 100, "0" * 64), Shard(".metadata", 10, "1" * 64))
    return CopyCheck(CheckpointManifest(step, of_node, tier, held_on, shards, 1000.0 + step, 3.0), problem)


def saved_everywhere(step: int, *, flushed: bool, buddies: dict[str, str] | None = None) -> list[CopyCheck]:
    """Every node's local copy, its copy on its buddy, and (when flushed) its copy on shared storage."""
    buddies = buddies or buddy_map(NODES, {})
    copies = [copy(step, n, "local") for n in NODES] + [copy(step, n, "buddy", buddies[n]) for n in NODES]
    return copies + ([copy(step, n, "shared") for n in NODES] if flushed else [])


def checkpoint(step: int, copies: list[CopyCheck]) -> SavedCheckpoint:
    return SavedCheckpoint(step, frozenset(NODES), tuple(copies))


# ---- the buddy map ---------------------------------------------------------------------------------
def test_buddies_sit_under_another_leaf_switch():
    leaf_of = {"node1": "leaf1", "node2": "leaf1", "node3": "leaf2", "node4": "leaf2"}
    assert buddy_map(NODES, leaf_of) == {"node1": "node3", "node2": "node4", "node3": "node1", "node4": "node2"}


def test_one_node_has_no_buddy():
    assert buddy_map(["node1"], {"node1": "leaf1"}) == {}
    assert buddy_map([], {}) == {}


def test_without_a_topology_every_node_still_has_another_node_as_buddy():
    buddies = buddy_map(NODES, {})
    assert sorted(buddies) == sorted(buddies.values()) == list(NODES)
    assert all(node != buddy for node, buddy in buddies.items())


def test_a_node_listed_twice_is_a_mistake_said_by_name():
    with pytest.raises(ValueError, match="node2"):
        buddy_map(["node1", "node2", "node2"], {})


@st.composite
def nodes_and_leaves(draw) -> tuple[list[str], dict[str, str]]:
    count = draw(st.integers(0, 40))
    leaves = draw(st.integers(1, 6))
    nodes = [f"node{i}" for i in range(count)]
    leaf_of = {n: f"leaf{draw(st.integers(0, leaves - 1))}" for n in nodes if draw(st.integers(0, 9))}
    return draw(st.permutations(nodes)), leaf_of


@SETTINGS
@given(nodes_and_leaves(), st.randoms())
def test_the_buddy_map_is_balanced_never_the_node_itself_and_crosses_leaves_all_it_can(given_nodes, shuffle):
    nodes, leaf_of = given_nodes
    buddies = buddy_map(nodes, leaf_of)
    if len(nodes) < 2:
        assert buddies == {}
        return
    assert sorted(buddies) == sorted(buddies.values()) == sorted(nodes)  # each keeps exactly one copy
    assert all(node != buddy for node, buddy in buddies.items())
    leaf = {n: leaf_of.get(n, "") for n in nodes}
    largest = max(Counter(leaf.values()).values())
    crossing = sum(leaf[n] != leaf[b] for n, b in buddies.items())
    if 2 * largest <= len(nodes):
        assert crossing == len(nodes)
    else:  # the big leaf's nodes can only cross to the others, the others only back: at most twice the others
        assert crossing == 2 * (len(nodes) - largest)
    reordered = list(nodes)
    shuffle.shuffle(reordered)
    assert buddy_map(reordered, dict(sorted(leaf_of.items(), reverse=True))) == buddies


# ---- the resume plan: stories ------------------------------------------------------------------------
def test_with_every_node_alive_each_loads_its_own_local_copy():
    plan = plan_resume(ResumeFacts((checkpoint(10, saved_everywhere(10, flushed=True)),
                                    checkpoint(20, saved_everywhere(20, flushed=False)))))
    assert plan.step == 20
    assert [(s.node, s.tier, s.held_on) for s in plan.sources] == [(n, "local", n) for n in NODES]
    assert plan.skipped == () and plan.fallback == ""
    assert plan.lines() == ["resuming from step 20: 4 node(s) from their own copies"]


def test_a_replacement_for_a_gone_node_loads_the_copy_its_buddy_kept():
    buddies = buddy_map(NODES, {})
    plan = plan_resume(ResumeFacts((checkpoint(20, saved_everywhere(20, flushed=False)),), gone=frozenset({"node3"})))
    assert plan.step == 20
    sources = {s.node: s for s in plan.sources}
    assert (sources["node3"].tier, sources["node3"].held_on) == ("buddy", buddies["node3"])
    assert all(sources[n].tier == "local" for n in NODES if n != "node3")
    assert plan.lines()[-1] == (f"resuming from step 20: 3 node(s) from their own copies, "
                                f"1 node(s) from a buddy's copy (node3's on {buddies['node3']})")
    assert plan.from_tiers("/ck/tiers/step-000000000020") == "in the nodes' tiers: 3 own copies, 1 buddy copy"


def test_a_node_and_its_buddy_both_gone_resume_from_the_last_flushed_checkpoint_and_say_why():
    assert buddy_map(NODES, {})["node3"] == "node4"
    plan = plan_resume(ResumeFacts((checkpoint(30, saved_everywhere(30, flushed=True)),
                                    checkpoint(40, saved_everywhere(40, flushed=False))),
                                   gone=frozenset({"node3", "node4"})))
    assert plan.step == 30
    assert {s.node: s.tier for s in plan.sources} == {"node1": "local", "node2": "local", "node3": "shared",
                                                      "node4": "buddy"}
    assert plan.from_tiers("/ck/tiers/step-000000000030") == \
        "in the nodes' tiers: 2 own copies, 1 buddy copy; 1 part on shared storage: /ck/tiers/step-000000000030"
    assert [s.step for s in plan.skipped] == [40]
    assert plan.skipped[0].missing == ("node3",)
    assert plan.skipped[0].why == ("step 40: node3's shards: local copy gone with node3; buddy copy on node4 "
                                   "gone with node4; not flushed to shared storage")


def test_a_buddy_copy_failing_its_checksum_falls_through_to_shared_storage_and_is_said():
    buddies = buddy_map(NODES, {})
    copies = [c for c in saved_everywhere(40, flushed=False) if c.manifest.where != f"node3's copy on {buddies['node3']}"]
    copies.append(copy(40, "node3", "buddy", buddies["node3"], CHECKSUM_FAILS))
    plan = plan_resume(ResumeFacts((checkpoint(20, saved_everywhere(20, flushed=True)), checkpoint(40, copies)),
                                   gone=frozenset({"node3"})))
    assert plan.step == 20
    assert plan.skipped[0].why == (f"step 40: node3's shards: local copy gone with node3; buddy copy on "
                                   f"{buddies['node3']} fails its checksum (shard 7.distcp); not flushed to "
                                   "shared storage")
    assert plan.lines()[0].startswith("skipping checkpoint step 40: node3's shards")
    copies.extend(copy(40, n, "shared") for n in NODES)  # the same checkpoint, flushed: node3 from there
    plan = plan_resume(ResumeFacts((checkpoint(40, copies),), gone=frozenset({"node3"})))
    assert (plan.step, {s.node: s.tier for s in plan.sources}["node3"]) == (40, "shared")


def test_a_local_copy_failing_its_checksum_is_replaced_by_the_buddys_copy():
    copies = [c for c in saved_everywhere(40, flushed=False) if c.manifest.where != "node2's local copy"]
    copies.append(copy(40, "node2", "local", problem=CHECKSUM_FAILS))
    plan = plan_resume(ResumeFacts((checkpoint(40, copies),)))
    assert plan.step == 40
    assert {s.node: s.tier for s in plan.sources}["node2"] == "buddy"


def test_a_checkpoint_whose_resume_failed_twice_gives_way_to_the_last_flushed_one():
    history = (checkpoint(20, saved_everywhere(20, flushed=True)), checkpoint(30, saved_everywhere(30, flushed=False)),
               checkpoint(40, saved_everywhere(40, flushed=False)))
    once = plan_resume(ResumeFacts(history, failed_resumes={40: 1}))
    assert once.step == 40 and once.fallback == ""
    twice = plan_resume(ResumeFacts(history, failed_resumes={40: FAILED_RESUMES_BEFORE_FALLBACK}))
    assert twice.step == 20
    assert all(s.tier == "shared" for s in twice.sources)
    assert twice.fallback == "resuming from step 40 failed 2 times: only a checkpoint flushed to shared storage is taken"
    assert [s.why for s in twice.skipped] == [
        "step 40: resuming from it failed 2 times; falling back to the newest checkpoint on shared storage",
        "step 30: not complete on shared storage: node1's shards: not flushed to shared storage. node2's shards: "
        "not flushed to shared storage. node3's shards: not flushed to shared storage. node4's shards: not flushed "
        "to shared storage"]
    assert twice.lines()[-2:] == [twice.fallback, "resuming from step 20: 4 node(s) from shared storage"]
    assert twice.from_tiers("/ck/tiers/step-000000000020") == ""  # read whole from shared storage


def test_nothing_complete_means_the_program_starts_from_its_beginning_and_says_so():
    plan = plan_resume(ResumeFacts((checkpoint(10, [copy(10, "node1", "local")]),)))
    assert plan.step is None and plan.sources == ()
    assert plan.skipped[0].missing == ("node2", "node3", "node4")
    assert plan.lines()[-1] == "no checkpoint is complete across its tiers: the program starts from its beginning"


def test_a_skipped_checkpoint_names_five_nodes_then_counts_the_rest():
    nodes = frozenset(f"n{i:02d}" for i in range(12))
    plan = plan_resume(ResumeFacts((SavedCheckpoint(10, nodes, ()),)))
    assert plan.skipped[0].why.count("'s shards:") == 5
    assert plan.skipped[0].why.endswith("and 7 more nodes' shards have no usable copy")
    assert len(plan.skipped[0].missing) == 12


def test_copies_of_another_step_or_two_checkpoints_of_one_step_are_mistakes():
    with pytest.raises(ValueError, match="step 20"):
        SavedCheckpoint(10, frozenset(NODES), (copy(20, "node1", "local"),))
    with pytest.raises(ValueError, match="step 10 is given twice"):
        ResumeFacts((checkpoint(10, []), checkpoint(10, [])))


# ---- the resume plan: properties ---------------------------------------------------------------------
@st.composite
def random_facts(draw) -> ResumeFacts:
    """Up to five checkpoints of up to five nodes; each node's copies in each tier present or not,
    verified or not; some nodes gone; some resumes failed."""
    nodes = [f"node{i}" for i in range(draw(st.integers(1, 5)))]
    checkpoints = []
    for step in draw(st.sets(st.integers(0, 60), max_size=5)):
        saving = draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True))
        copies = []
        for node in saving:
            for tier in ("local", "buddy", "shared"):
                for _ in range(draw(st.integers(0, 2 if tier == "buddy" else 1))):
                    held_on = node if tier == "local" else None
                    if tier == "buddy":
                        others = [n for n in nodes if n != node]
                        if not others:
                            continue
                        held_on = draw(st.sampled_from(others))
                    problem = draw(st.sampled_from(["", "", CHECKSUM_FAILS]))
                    copies.append(copy(step, node, tier, held_on, problem))
        checkpoints.append(SavedCheckpoint(step, frozenset(saving), tuple(copies)))
    gone = frozenset(draw(st.lists(st.sampled_from(nodes), unique=True)))
    failed = draw(st.dictionaries(st.sampled_from([c.step for c in checkpoints] or [0]), st.integers(0, 3)))
    return ResumeFacts(tuple(checkpoints), gone, failed)


def usable(check: CopyCheck, gone: frozenset[str]) -> bool:
    return check.verified and check.manifest.held_on not in gone


def complete(saved: SavedCheckpoint, gone: frozenset[str], *, shared_only: bool = False) -> bool:
    """Every node of the saving map has a usable copy (only on shared storage, when asked)."""
    return all(any(c.manifest.of_node == node and usable(c, gone) and (c.manifest.tier == "shared" or not shared_only)
                   for c in saved.copies) for node in saved.nodes)


@SETTINGS
@given(random_facts())
def test_the_chosen_checkpoint_is_complete_from_usable_copies(facts):
    plan = plan_resume(facts)
    if plan.step is None:
        assert plan.sources == ()
        return
    chosen = next(c for c in facts.checkpoints if c.step == plan.step)
    assert sorted(s.node for s in plan.sources) == sorted(chosen.nodes)
    checks = {(c.manifest, c.problem) for c in chosen.copies}
    for source in plan.sources:
        assert source.copy.of_node == source.node and source.copy.step == plan.step
        assert (source.copy, "") in checks  # a verified copy of this checkpoint
        assert source.held_on not in facts.gone  # a gone node's copies, its local one first, never
        if plan.fallback:
            assert source.tier == "shared"


@SETTINGS
@given(random_facts())
def test_no_newer_checkpoint_could_have_been_taken_and_each_says_why(facts):
    plan = plan_resume(facts)
    newer = sorted((c for c in facts.checkpoints if plan.step is None or c.step > plan.step),
                   key=lambda c: c.step, reverse=True)
    assert [s.step for s in plan.skipped] == [c.step for c in newer]
    failed_twice_above = False
    for saved, skipped in zip(newer, plan.skipped):
        assert skipped.why.startswith(f"step {saved.step}: ") and len(skipped.why) > len(f"step {saved.step}: ")
        if facts.failed_resumes.get(saved.step, 0) >= FAILED_RESUMES_BEFORE_FALLBACK:
            failed_twice_above = True
            continue
        assert not complete(saved, facts.gone, shared_only=failed_twice_above)
        assert skipped.missing
    assert bool(plan.fallback) == failed_twice_above


@SETTINGS
@given(random_facts(), st.randoms())
def test_the_plan_does_not_depend_on_the_order_things_were_found_in(facts, shuffle):
    checkpoints = []
    for saved in facts.checkpoints:
        copies = list(saved.copies)
        shuffle.shuffle(copies)
        checkpoints.append(SavedCheckpoint(saved.step, saved.nodes, tuple(copies)))
    shuffle.shuffle(checkpoints)
    assert plan_resume(ResumeFacts(tuple(checkpoints), facts.gone, facts.failed_resumes)) == plan_resume(facts)


def test_a_resume_at_a_thousand_nodes_is_planned_quickly():
    nodes = [f"node{i:04d}" for i in range(1000)]
    buddies = buddy_map(nodes, {n: f"leaf{i // 32}" for i, n in enumerate(nodes)})
    rng = random.Random(7)
    gone = frozenset(rng.sample(nodes, 3))
    copies = [copy(100, n, "local") for n in nodes] + [copy(100, n, "buddy", buddies[n]) for n in nodes]
    plan = plan_resume(ResumeFacts((SavedCheckpoint(100, frozenset(nodes), tuple(copies)),), gone))
    assert plan.step == 100
    assert {s.node for s in plan.sources if s.tier == "buddy"} == gone


# ---- from what the nodes hold to a plan, and to each slot of the new map ---------------------------
def held(step: int, of_node: str, tier: str, held_on: str | None, slot: int, slots: int = 3) -> CheckpointManifest:
    return CheckpointManifest(step, of_node, tier, held_on, (), 1000.0 + step, 0.5, slot, slots)


def three_nodes_saved(step: int) -> list[CheckpointManifest]:
    """node1..node3 in slots 0..2, each with its local copy and a copy on the next node."""
    nodes = ["node1", "node2", "node3"]
    return [held(step, n, "local", n, s) for s, n in enumerate(nodes)] + \
        [held(step, n, "buddy", nodes[(s + 1) % 3], s) for s, n in enumerate(nodes)]


def test_a_node_lost_after_its_local_save_resumes_on_the_spare_from_its_buddys_copy():
    facts = resume_facts(three_nodes_saved(20) + three_nodes_saved(10), gone={"node2"})
    plan = plan_resume(facts)
    assert plan.step == 20
    slots = slot_sources(plan, ["node1", "spare", "node3"], {"node1": "spare", "spare": "node3", "node3": "node1"})
    assert [(s.node, s.tier, s.of_node, s.held_on) for s in slots] == [
        ("node1", "local", "node1", "node1"), ("spare", "buddy", "node2", "node3"), ("node3", "local", "node3", "node3")]
    assert "1 node(s) from a buddy's copy (node2's on node3)" in plan.lines()[-1]


def test_a_slot_no_node_holds_anything_of_is_never_taken_as_complete():
    copies = [m for m in three_nodes_saved(20) if m.slot != 1] + three_nodes_saved(10)
    plan = plan_resume(resume_facts(copies))
    assert plan.step == 10
    assert "slot 1's shards" in plan.skipped[0].why


def test_a_copy_a_resume_could_not_load_is_passed_over_for_the_next_tier():
    copies = three_nodes_saved(20) + [held(20, "node2", "shared", None, 1)]
    bad = {copy_key(held(20, "node2", "buddy", "node3", 1)): "fails its checksum (shard rank-1.json)"}
    plan = plan_resume(resume_facts(copies, gone={"node2"}, problems=bad))
    assert plan.step == 20 and {s.node: s.tier for s in plan.sources}["node2"] == "shared"


def test_a_survivor_placed_in_another_slot_fetches_the_shards_of_the_slot_it_took():
    plan = plan_resume(resume_facts(three_nodes_saved(20), gone={"node1"}))
    slots = slot_sources(plan, ["node3", "node2", "spare"], {})
    assert [(s.tier, s.of_node, s.held_on) for s in slots] == [
        ("buddy", "node1", "node2"), ("local", "node2", "node2"), ("buddy", "node3", "node3")]


def test_a_checkpoint_of_another_map_size_is_refused_for_the_new_map():
    plan = plan_resume(resume_facts(three_nodes_saved(20)))
    with pytest.raises(ValueError, match="map of 3 nodes, the new map has 2"):
        slot_sources(plan, ["node1", "node2"], {})


# Names that sort differently as text and as quoted text if anything went wrong: prefixes of each other,
# '.', '-', '_', digits, capitals.
TRICKY_NAMES = ("n1", "n1-", "n1.a", "n1_b", "n10", "N1", "a", "a-b", "0n")


@st.composite
def known_copies(draw) -> tuple[list[CheckpointManifest], set[str], dict, dict]:
    """Copies as the agent knows them (some named twice, some slots saved by two nodes, equal times), the
    problems found with some, the nodes gone and the failed resumes."""
    nodes = draw(st.lists(st.sampled_from(TRICKY_NAMES), min_size=1, max_size=6, unique=True))
    copies = []
    for _ in range(draw(st.integers(0, 40))):
        step = draw(st.sampled_from([10, 20, 30]))
        slots = draw(st.integers(1, 4))
        of_node = draw(st.sampled_from(nodes))
        tier = draw(st.sampled_from(["local", "buddy", "shared"]))
        held_on = {"local": of_node, "shared": None}.get(tier)
        if tier == "buddy":
            others = [n for n in nodes if n != of_node]
            if not others:
                continue
            held_on = draw(st.sampled_from(others))
        written_at = draw(st.sampled_from([0, 1.0, 1, 2.5]))
        copies.append(CheckpointManifest(step, of_node, tier, held_on, (), written_at, 0.5,
                                         draw(st.integers(0, slots - 1)), slots))
    keys = [copy_key(m) for m in copies]
    problems = {k: CHECKSUM_FAILS for k in draw(st.lists(st.sampled_from(keys), unique=True))} if keys else {}
    gone = set(draw(st.lists(st.sampled_from(nodes), unique=True)))
    failed = draw(st.dictionaries(st.sampled_from([10, 20, 30]), st.integers(0, 3)))
    return copies, gone, problems, failed


def facts_read_plainly(copies, gone, problems, failed) -> ResumeFacts:
    """What resume_facts says, read the plain way: per step, each slot's saver from the copies sorted by
    time, one copy per copy_key (the last one), the copies sorted by their key as text."""
    by_step: dict[int, list[CheckpointManifest]] = {}
    for m in copies:
        by_step.setdefault(m.step, []).append(m)
    checkpoints = []
    for step, found in sorted(by_step.items()):
        saver = {m.slot: m.of_node for m in sorted(found, key=lambda m: (m.written_at, m.of_node))}
        nodes = frozenset(saver.get(slot, f"slot {slot}") for slot in range(max(m.slots for m in found)))
        unique = {copy_key(m): m for m in found}
        checks = tuple(CopyCheck(m, problems.get(key, ""))
                       for key, m in sorted(unique.items(), key=lambda kv: str(kv[0])) if m.of_node in nodes)
        checkpoints.append(SavedCheckpoint(step, nodes, checks))
    return ResumeFacts(tuple(checkpoints), frozenset(gone), dict(failed))


def choice_read_plainly(facts: ResumeFacts) -> tuple[int | None, dict[str, CheckpointManifest]]:
    """The checkpoint and each node's copy plan_resume takes, read the plain way: newest first, a checkpoint
    failed twice passed over for shared copies only from then on; each node's copies of a tier sorted by
    (held_on, written_at, problem); its first verified local copy (unless it is gone), else its first verified
    buddy copy (by holder) on a node not gone, else its first verified shared copy."""
    shared_only = False
    for saved in sorted(facts.checkpoints, key=lambda c: c.step, reverse=True):
        if facts.failed_resumes.get(saved.step, 0) >= FAILED_RESUMES_BEFORE_FALLBACK:
            shared_only = True
            continue
        chosen = {}
        ordered = sorted(saved.copies, key=lambda c: (c.manifest.held_on or "", c.manifest.written_at, c.problem))
        for node in saved.nodes:
            tier = {name: [c for c in ordered if (c.manifest.of_node, c.manifest.tier) == (node, name)]
                    for name in ("local", "buddy", "shared")}
            local = [c for c in tier["local"] if c.verified and node not in facts.gone]
            buddy = [c for c in sorted(tier["buddy"], key=lambda c: c.manifest.held_on)
                     if c.verified and c.manifest.held_on not in facts.gone]
            shared = [c for c in tier["shared"] if c.verified]
            usable = shared if shared_only else local + buddy + shared
            if usable:
                chosen[node] = usable[0].manifest
        if len(chosen) == len(saved.nodes):
            return saved.step, chosen
    return None, {}


@SETTINGS
@given(random_facts())
def test_the_plan_takes_the_checkpoint_and_copies_a_plain_reading_takes(facts):
    plan = plan_resume(facts)
    assert (plan.step, {s.node: s.copy for s in plan.sources}) == choice_read_plainly(facts)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(known_copies())
def test_the_agents_plan_from_its_copies_is_the_plan_of_the_facts_read_the_plain_way(known):
    copies, gone, problems, failed = known
    plainly = facts_read_plainly(copies, gone, problems, failed)
    assert resume_facts(copies, gone=gone, problems=problems, failed_resumes=failed) == plainly
    plan = plan_resume(plainly)
    assert (plan.step, {s.node: s.copy for s in plan.sources}) == choice_read_plainly(plainly)
    assert plan_resume_from_copies(copies, gone=gone, problems=problems, failed_resumes=failed) == plan
    assert plan_resume_from_copies(iter(copies), gone=gone, problems=problems, failed_resumes=failed) == plan


# ---- where a resume came from (the journal's `resumed` line) ---------------------------------------

def test_a_resumes_line_counts_each_slots_tier_as_its_node_said_names_five_buddy_copies_and_the_slowest_read():
    planned = [SlotSource(0, "node1", "node2", "local", "node1", "node1")] + [
        SlotSource(s, f"spare{s}", "node1", "buddy", f"node{s + 10}", f"node{s + 20}") for s in range(1, 8)]
    said = {"node1": LastResume(20, "local", "node1", "node1", 0.4, 100.0),
            "spare1": LastResume(20, "shared", "node11", "", 9.0, 100.0),  # its buddy's copy failed: shared
            "spare2": LastResume(20, "buddy", "node12", "node22", 2.5, 100.0)}
    line = resumed_event(at=101.0, job_id="42", restart=1, step=20, planned=planned, said=said)
    assert dict(line.tiers) == {"local": 1, "buddy": 6, "shared": 1}
    assert line.buddy_copies == tuple(f"node{s + 10}'s on node{s + 20}" for s in range(2, 7))
    assert (line.more_buddy_copies, line.reported, line.nodes) == (1, 3, 8)
    assert (line.read_seconds, line.slowest_node) == (9.0, "spare1")
    assert resumed_text(line) == (
        "step 20: 1 node(s) from their own copies, 6 node(s) from a buddy's copy (node12's on node22, node13's on "
        "node23, node14's on node24, node15's on node25, node16's on node26 and 1 more), 1 node(s) from shared "
        "storage; read in 9.00 s (slowest: spare1, 3 of 8 nodes said)")
    nothing = resumed_event(at=101.0, job_id="42", restart=0, step=20, planned=planned[:1], said={})
    assert nothing.read_seconds is None and dict(nothing.tiers) == {"local": 1}
    assert resumed_text(nothing).endswith("read time unknown (no node said before the step ended)")


def test_only_a_resume_of_this_step_since_it_started_counts_not_one_an_earlier_launch_left():
    earlier = LastResume(20, "local", "node1", "node1", 0.4, 90.0)
    holdings = {"node1": CheckpointHoldings("node1", (), 100.0, earlier),
                "node2": CheckpointHoldings("node2", (), 100.0, LastResume(10, "local", "node2", "node2", 1.0, 101.0)),
                "node3": CheckpointHoldings("node3", (), 100.0, LastResume(20, "local", "node3", "node3", 1.0, 50.0)),
                "node4": CheckpointHoldings("node4", (), 100.0, LastResume(20, "local", "node4", "node4", 1.0, 97.0))}
    nodes = ["node1", "node2", "node3", "node4", "node5"]
    assert resume_said(holdings, nodes, 20, 100.0, {"node1": earlier}) == {"node4": holdings["node4"].last_resume}
    assert "node1" in resume_said(holdings, nodes, 20, 80.0, {})


# ---- the step's map keeps the nodes holding the copies it reads ----------------------------------------------

def test_a_resubmitted_job_whose_map_left_the_holder_as_spare_drops_a_node_that_holds_nothing_instead():
    # node2 was lost; node1 holds its own part and node2's buddy copy; best fit took node3 node4 (one leaf).
    assert nodes_for_map(["node1", "node3", "node4"], ["node3", "node4"], {"node1"}) == ["node1", "node3"]


def test_a_map_that_already_takes_every_holder_is_kept():
    assert nodes_for_map(["node1", "node2", "node3"], ["node1", "node2"], {"node1", "node2"}) is None
    assert nodes_for_map(["node1", "node2", "node3"], ["node1", "node2"], set()) is None


@given(st.integers(1, 12), st.integers(0, 4), st.randoms(), st.data())
def test_the_nodes_for_the_map_keep_every_holder_they_can_and_the_map_s_size(slots, spares, rnd, data):
    nodes = [f"n{i}" for i in range(slots + spares)]
    rnd.shuffle(nodes)
    in_map = rnd.sample(nodes, slots)
    holders = set(data.draw(st.sets(st.sampled_from(nodes + ["gone"]))))
    chosen = nodes_for_map(nodes, in_map, holders)
    held = holders & set(nodes)
    if chosen is None:  # already all in the map, or more holders than the map has nodes
        assert held <= set(in_map) or len(held) > slots
    else:
        assert held <= set(chosen) and len(chosen) == slots
        assert chosen == [n for n in nodes if n in chosen]  # in the allocation's order


def test_a_checkpoint_is_flushed_whole_once_every_slot_reached_shared_storage_and_not_again():
    def flushed(node: str, step: int, slot: int, save_seconds: float) -> HeldCopy:
        return HeldCopy(step, node, "shared", slot, 3, 1000.0 + step, save_seconds)

    holdings = [CheckpointHoldings("node1", (flushed("node1", 10, 0, 2.0), flushed("node1", 20, 0, 1.0),
                                             HeldCopy(30, "node1", "local", 0, 3, 1030.0, 1.0))),
                CheckpointHoldings("node2", (flushed("node2", 10, 1, 5.0), flushed("node2", 20, 1, 1.0))),
                CheckpointHoldings("node3", (flushed("node3", 10, 2, 3.0),))]
    assert flushed_whole(holdings) == [FlushedCheckpoint(10, ("node1", "node2", "node3"), 5.0)]
    assert flushed_whole(holdings, done={10}) == []  # its complete.json is written: once is enough
