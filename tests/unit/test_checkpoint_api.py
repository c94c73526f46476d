"""The training program's side of multi-level checkpoints, as a user sees it: a job of two nodes with
two ranks each, simulated in one process (each node its own tier root, copies moving through
tests.fakes.FakeCopyNetwork), saving, keeping copies on buddies and shared storage, and resuming."""

from __future__ import annotations

import io
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from clusterctl.checkpoint import Checkpointer, CheckpointSetupError
from clusterctl.records.checkpoint_holdings import read_holdings
from clusterctl.records.checkpoint_manifest import read_checkpoint_manifest
from clusterctl.records.checkpoint_settings import SETTINGS_ENV, CheckpointSettings
from clusterctl.records.resume_failure import EXIT_RESUME_FAILED, read_resume_failures
from clusterctl.records.tier_index import TierSlot, write_tier_index
from tests.fakes import FakeCopyNetwork

KEY = bytes(range(32))
RUN_KEY = "0123456789abcdef"
RANKS_PER_NODE = 2


def payload(rank: int, step: int) -> bytes:
    return f"rank {rank} at step {step}\n".encode() * (rank + 3)


class Job:
    """One step of a job: each node's local ranks as Checkpointers, and what they printed."""

    def __init__(self, tmp_path: Path, network: FakeCopyNetwork, slots: list[TierSlot], *,
                 resume_step: int | None = None, keep: int = 2, flush_every: int = 2, budget: int = 0) -> None:
        self.tmp_path, self.network = tmp_path, network
        self.launch = tmp_path / "run" / "launch-1"
        self.launch.mkdir(parents=True, exist_ok=True)
        index = self.launch / "tiers.idx"
        write_tier_index(index, resume_step, slots)
        self.shared = tmp_path / "run" / "checkpoints"
        self.stderr = io.StringIO()
        self.ranks: dict[str, list[Checkpointer]] = {}
        for slot, line in enumerate(slots):
            settings = CheckpointSettings(run_key=RUN_KEY, local_base=str(tmp_path / "nodes" / line.node),
                                          shared_dir=str(self.shared), tier_index=str(index), port=4711, keep=keep,
                                          flush_every_steps=flush_every, local_budget_bytes=budget,
                                          resume_step=resume_step)
            self.ranks[line.node] = [
                Checkpointer(settings, node=line.node, slot=slot, slots=len(slots), rank=slot * RANKS_PER_NODE + lr,
                             local_rank=lr, local_ranks=RANKS_PER_NODE, key=KEY, transport=network,
                             stderr=self.stderr, background=False)
                for lr in range(RANKS_PER_NODE)]

    def tier(self, node: str) -> Path:
        return self.tmp_path / "nodes" / node / f"clusterctl-{os.getuid()}" / f"ckpt-{RUN_KEY}" / node

    def save(self, step: int) -> None:
        """Every rank saves its file; then each node's first rank does its background round."""
        for ranks in self.ranks.values():
            for ckpt in ranks:
                with ckpt.save_files(step) as directory:
                    (directory / f"rank-{ckpt.rank}.bin").write_bytes(payload(ckpt.rank, step))
        for ranks in self.ranks.values():
            ranks[0].tend()

    def close(self, *, finished: bool = False) -> None:
        """Every rank closes: `finished`, training is done; else the job ends before it (a failure, a
        time limit), and the nodes keep their copies for the resume that follows."""
        for ranks in self.ranks.values():
            for ckpt in ranks:
                ckpt.close(finished=finished)


def steps_in(folder: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("step-")) for p in folder.glob("step-*")) if folder.is_dir() else []


def two_nodes(tier: str = "-", of: tuple[str, str] = ("-", "-"), held: tuple[str, str] = ("-", "-"),
              nodes: tuple[str, str] = ("node1", "node2")) -> list[TierSlot]:
    return [TierSlot(node=nodes[0], buddy=nodes[1], tier=tier, of_node=of[0], held_on=held[0]),
            TierSlot(node=nodes[1], buddy=nodes[0], tier=tier, of_node=of[1], held_on=held[1])]


def saved_job(tmp_path: Path, network: FakeCopyNetwork, steps: range, flush_every: int = 2) -> Job:
    job = Job(tmp_path, network, two_nodes(), flush_every=flush_every)
    for step in steps:
        job.save(step)
    job.close()
    return job


def test_saves_are_committed_locally_kept_by_the_buddy_flushed_every_kth_step_and_retention_keeps_two(
        tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=2)
    for step in (1, 2, 3, 4, 5):
        job.save(step)

    for node, buddy in (("node1", "node2"), ("node2", "node1")):
        assert steps_in(job.tier(node) / "local") == [4, 5]
        assert steps_in(job.tier(buddy) / "buddy" / node) == [4, 5]
        manifest = read_checkpoint_manifest(job.tier(node) / "local" / "step-000000000005" / "manifest.json")
        assert (manifest.tier, manifest.of_node, manifest.held_on) == ("local", node, node)
        assert [s.name for s in manifest.shards] == [f"rank-{r}.bin" for r in manifest_ranks(node)]
        kept = read_checkpoint_manifest(job.tier(buddy) / "buddy" / node / "step-000000000005" / "manifest.json")
        assert (kept.tier, kept.held_on, kept.shards) == ("buddy", buddy, manifest.shards)
    assert steps_in(job.shared / "tiers") == [2, 4]
    assert sorted(p.name for p in (job.shared / "tiers" / "step-000000000004").iterdir()) == \
        ["slot-000000", "slot-000001"]
    flushed = read_checkpoint_manifest(job.shared / "tiers" / "step-000000000004" / "slot-000001" / "manifest.json")
    assert (flushed.tier, flushed.held_on, flushed.of_node, flushed.slot, flushed.slots) == \
        ("shared", None, "node2", 1, 2)

    holdings = read_holdings(job.tier("node1") / "holdings.json")
    assert holdings is not None and holdings.node == "node1"
    assert {(c.tier, c.of_node, c.step) for c in holdings.copies} == {
        ("local", "node1", 4), ("local", "node1", 5), ("buddy", "node2", 4), ("buddy", "node2", 5),
        ("shared", "node1", 2), ("shared", "node1", 4)}
    job.close()
    assert steps_in(job.shared / "tiers") == [2, 4, 5], "the newest copy is flushed at the end"
    assert job.stderr.getvalue() == ""
    assert steps_in(job.tier("node1") / "local") == [4, 5], "a job that ends before its training keeps them"


def test_when_training_is_done_each_node_empties_its_tier_after_the_last_flush(tmp_path: Path) -> None:
    job = Job(tmp_path, FakeCopyNetwork(), two_nodes(), flush_every=100)
    for step in (1, 2, 3):
        job.save(step)
    job.close(finished=True)
    assert steps_in(job.shared / "tiers") == [3], "the newest is flushed first"
    for node in ("node1", "node2"):
        assert steps_in(job.tier(node) / "local") == [] and not list((job.tier(node) / "buddy").glob("*/step-*"))
        holdings = read_holdings(job.tier(node) / "holdings.json")
        assert holdings is not None and {c.tier for c in holdings.copies} <= {"shared"}
        assert f"training done on {node}: its checkpoint copies are removed" in job.stderr.getvalue()


def manifest_ranks(node: str) -> list[int]:
    slot = int(node.removeprefix("node")) - 1
    return [slot * RANKS_PER_NODE + lr for lr in range(RANKS_PER_NODE)]


def test_a_replacement_node_resumes_from_the_buddy_copy_bit_identical(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    saved_job(tmp_path, network, range(1, 4))
    network.gone.add("node1")  # node1 died: node3 takes its slot, its copy is fetched from node2
    survivor = Job(tmp_path, network,
                   two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node3", "node2")),
                   resume_step=3)
    first, second = (ckpt.resume() for ckpt in survivor.ranks["node3"])
    assert first is not None and second == first and first.step == 3
    assert first.directory == survivor.tier("node3") / "local" / "step-000000000003"
    for rank in (0, 1):
        assert (first.directory / f"rank-{rank}.bin").read_bytes() == payload(rank, 3)
    staged = read_checkpoint_manifest(first.directory / "manifest.json")
    assert (staged.of_node, staged.tier, staged.slot, staged.slots) == ("node3", "local", 0, 2)
    assert survivor.ranks["node3"][0].bad_copies == ()
    # The node's holdings say where its files came from and what reading them took (the agent journals it),
    # and a later rewrite by the node's first rank (a save) keeps it.
    assert (first.tier, first.of_node, first.held_on) == ("buddy", "node1", "node2")
    held = read_holdings(survivor.tier("node3") / "holdings.json")
    assert held is not None and held.last_resume is not None
    assert (held.last_resume.step, held.last_resume.tier, held.last_resume.of_node, held.last_resume.held_on,
            held.last_resume.seconds) == (3, "buddy", "node1", "node2", first.seconds)
    survivor.ranks["node3"][0].tend()
    tier = survivor.ranks["node3"][0].tier
    assert tier is not None and tier.write_holdings().last_resume == held.last_resume
    again = read_holdings(survivor.tier("node3") / "holdings.json")
    assert again is not None and again.last_resume == held.last_resume


def test_a_corrupted_buddy_copy_falls_back_to_shared_storage_and_is_named(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = saved_job(tmp_path, network, range(1, 5))
    shard = job.tier("node2") / "buddy" / "node1" / "step-000000000004" / "rank-1.bin"
    data = bytearray(shard.read_bytes())
    data[3] ^= 0x01
    shard.write_bytes(bytes(data))
    network.gone.add("node1")
    survivor = Job(tmp_path, network,
                   two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node3", "node2")),
                   resume_step=4)
    resume = survivor.ranks["node3"][0].resume()
    assert resume is not None and resume.step == 4
    assert (resume.directory / "rank-1.bin").read_bytes() == payload(1, 4)
    [bad] = survivor.ranks["node3"][0].bad_copies
    assert (bad.step, bad.of_node, bad.tier, bad.held_on) == (4, "node1", "buddy", "node2")
    assert "checksum" in bad.problem and "rank-1.bin" in bad.problem
    assert "passed over node1's buddy copy on node2" in survivor.stderr.getvalue()
    held = read_holdings(survivor.tier("node3") / "holdings.json")
    assert held is not None and held.last_resume is not None and held.last_resume.tier == "shared"
    assert (resume.tier, held.last_resume.held_on) == ("shared", "")


def test_a_fetched_copy_whose_bytes_the_transport_measured_wrong_is_never_loaded_even_unrefused(
        tmp_path: Path) -> None:
    # The replacement does not hash a fetched copy again: it checks what the transport measured while
    # writing it, so a transport that forgot to refuse a bad copy still cannot get it loaded.
    network = FakeCopyNetwork()
    job = saved_job(tmp_path, network, range(1, 5))
    shard = job.tier("node2") / "buddy" / "node1" / "step-000000000004" / "rank-0.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01
    shard.write_bytes(bytes(data))
    network.gone.add("node1")
    network.unchecked.add("node2")
    survivor = Job(tmp_path, network,
                   two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node3", "node2")),
                   resume_step=4)
    resume = survivor.ranks["node3"][0].resume()
    assert resume is not None and resume.tier == "shared"
    assert (resume.directory / "rank-0.bin").read_bytes() == payload(0, 4)
    [bad] = survivor.ranks["node3"][0].bad_copies
    assert (bad.tier, bad.held_on, bad.problem) == ("buddy", "node2", "fails its checksum (shard rank-0.bin)")


def test_the_node_keeping_the_lost_nodes_copy_takes_its_slot_without_a_second_copy_in_memory(
        tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = saved_job(tmp_path, network, range(1, 4), flush_every=100)
    network.gone.add("node1")
    kept = job.tier("node2") / "buddy" / "node1" / "step-000000000003"
    # node2 kept node1's copy; node2 now takes node1's slot 0 and a spare, node4, takes slot 1.
    again = Job(tmp_path, network,
                two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node2", "node4")),
                resume_step=3, flush_every=100)
    resume = again.ranks["node2"][0].resume()
    assert resume is not None and (resume.step, resume.tier, resume.of_node, resume.held_on) == \
        (3, "buddy", "node1", "node2")
    assert resume.source == "node1's copy kept on this node"
    for rank in (0, 1):
        staged = resume.directory / f"rank-{rank}.bin"
        assert staged.read_bytes() == payload(rank, 3)
        assert os.stat(staged).st_ino == os.stat(kept / staged.name).st_ino, "the same bytes, linked, not copied"
    assert again.ranks["node2"][0].bad_copies == ()


def test_a_corrupted_copy_kept_on_the_node_itself_is_caught_before_it_is_staged(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = saved_job(tmp_path, network, range(1, 4))
    shard = job.tier("node2") / "buddy" / "node1" / "step-000000000003" / "rank-1.bin"
    shard.write_bytes(shard.read_bytes()[:-1] + b"?")
    network.gone.add("node1")
    again = Job(tmp_path, network,
                two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node2", "node4")),
                resume_step=3)
    resume = again.ranks["node2"][0].resume()
    assert resume is not None and resume.tier == "shared"
    assert (resume.directory / "rank-1.bin").read_bytes() == payload(1, 3)
    [bad] = again.ranks["node2"][0].bad_copies
    assert (bad.tier, bad.held_on, bad.problem) == ("buddy", "node2", "fails its checksum (shard rank-1.bin)")


def test_no_usable_copy_writes_a_resume_failure_and_exits_87(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = saved_job(tmp_path, network, range(1, 4))
    shutil.rmtree(job.shared / "tiers" / "step-000000000003")  # flushed at the end, then lost
    network.gone.add("node1")
    network.gone.add("node2")
    survivor = Job(tmp_path, network,
                   two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node3", "node4")),
                   resume_step=3)
    with pytest.raises(SystemExit) as exited:
        survivor.ranks["node3"][0].resume()
    assert exited.value.code == EXIT_RESUME_FAILED == 87
    [failure] = read_resume_failures(survivor.launch)
    assert (failure.node, failure.step) == ("node3", 3)
    assert [(b.tier, b.held_on) for b in failure.bad_copies] == [("buddy", "node2"), ("shared", None)]
    said = survivor.stderr.getvalue().strip().splitlines()
    assert len(said) == 1 and "cannot resume on node3" in said[0] and "exiting with 87" in said[0]
    with pytest.raises(SystemExit):  # the node's other rank does not try again: it exits too
        survivor.ranks["node3"][1].resume()
    assert len(read_resume_failures(survivor.launch)) == 1


def test_a_save_beyond_the_local_budget_goes_to_shared_storage_and_says_why(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100, budget=64)
    job.save(1)
    job.save(2)
    assert steps_in(job.tier("node1") / "local") == []
    assert steps_in(job.shared / "tiers") == [1, 2]
    manifest = read_checkpoint_manifest(job.shared / "tiers" / "step-000000000002" / "slot-000000" / "manifest.json")
    assert [s.name for s in manifest.shards] == ["rank-0.bin", "rank-1.bin"] and manifest.tier == "shared"
    said = job.stderr.getvalue()
    assert "budget is 64 bytes" in said and said.count("node's local tier") + said.count("went to shared") <= 4
    holdings = read_holdings(job.tier("node1") / "holdings.json")
    assert holdings is not None and {(c.tier, c.step) for c in holdings.copies} == {("shared", 1), ("shared", 2)}


def test_a_buddy_that_is_gone_is_said_once_and_copies_stay_local(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100)
    network.gone.add("node2")
    for step in (1, 2, 3):
        job.save(step)
    assert steps_in(job.tier("node1") / "local") == [2, 3]
    assert job.stderr.getvalue().count("cannot send copies to buddy node2") == 1


def test_a_planted_symlink_tier_root_is_never_followed_and_the_job_saves_to_shared_storage(tmp_path: Path) -> None:
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    base = tmp_path / "nodes" / "node1"
    base.mkdir(parents=True)
    (base / f"clusterctl-{os.getuid()}").symlink_to(elsewhere)
    job = Job(tmp_path, FakeCopyNetwork(), two_nodes())
    job.save(1)
    assert list(elsewhere.iterdir()) == []
    said = job.stderr.getvalue()
    assert f"{base}/clusterctl-{os.getuid()} belongs to uid {os.getuid()}" in said and "a symlink" in said
    assert "this node's checkpoints go to shared storage (the next tier)" in said


def test_from_env_is_none_outside_a_tiered_job_and_names_what_is_wrong(tmp_path: Path) -> None:
    assert Checkpointer.from_env({}) is None
    with pytest.raises(CheckpointSetupError, match=SETTINGS_ENV):
        Checkpointer.from_env({SETTINGS_ENV: "{not json"})
    settings = CheckpointSettings(run_key=RUN_KEY, local_base=str(tmp_path), shared_dir=str(tmp_path / "shared"),
                                  tier_index="", port=4711)
    environ = {**settings.to_env(), "SLURMD_NODENAME": "node1", "RANK": "1", "LOCAL_RANK": "1",
               "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0", "CLUSTERCTL_REPORT_KEY": KEY.hex()}
    ckpt = Checkpointer.from_env(environ)
    assert ckpt is not None and (ckpt.node, ckpt.slot, ckpt.rank, ckpt.local_rank) == ("node1", 0, 1, 1)
    assert ckpt.resume() is None
    with pytest.raises(CheckpointSetupError, match=r"\$LOCAL_RANK='x' is not a whole number"):
        Checkpointer.from_env({**environ, "LOCAL_RANK": "x"})
    with pytest.raises(CheckpointSetupError, match="CLUSTERCTL_REPORT_KEY"):
        Checkpointer.from_env({**environ, "CLUSTERCTL_REPORT_KEY": "abc"})


def test_torch_state_saves_and_loads_through_the_tiers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes())
    weights = {r: torch.arange(6, dtype=torch.float32) * (r + 1) for r in range(4)}
    for ranks in job.ranks.values():
        for ckpt in ranks:
            ckpt.save_state(7, {"model": {"w": weights[ckpt.rank]}, "step": 7})
    job.close()
    again = Job(tmp_path, network, two_nodes("local", of=("node1", "node2"), held=("node1", "node2")),
                resume_step=7)
    for ranks in again.ranks.values():
        for ckpt in ranks:
            resume = ckpt.resume()
            assert resume is not None and resume.step == 7
            state: dict[str, Any] = {"model": {"w": torch.zeros(6)}, "step": 0}
            ckpt.load_state(state)
            assert torch.equal(state["model"]["w"], weights[ckpt.rank]) and state["step"] == 7


def test_a_node_whose_local_tier_cannot_be_made_saves_to_shared_storage(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "node1").write_text("a file where the node's local directory should be")
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100)
    job.save(1)
    job.save(2)
    job.close()
    assert (job.shared / "tiers" / "step-000000000002" / "slot-000000" / "manifest.json").is_file()
    assert (job.shared / "tiers" / "step-000000000001" / "slot-000000" / "manifest.json").is_file()
    assert steps_in(job.tier("node2") / "local") == [1, 2]
    assert not (job.shared / "tiers" / "step-000000000001" / "slot-000001").exists(), "node2 is not affected"
    said = job.stderr.getvalue()
    assert said.count("to shared storage directly") == 1 and "cannot be made" in said


def test_the_background_thread_sends_and_flushes_without_being_driven(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    index = tmp_path / "launch" / "tiers.idx"
    write_tier_index(index, None, two_nodes())
    shared = tmp_path / "checkpoints"
    ranks = []
    for slot, node in enumerate(("node1", "node2")):
        settings = CheckpointSettings(run_key=RUN_KEY, local_base=str(tmp_path / node), shared_dir=str(shared),
                                      tier_index=str(index), port=4711, flush_every_steps=3)
        ranks.append(Checkpointer(settings, node=node, slot=slot, slots=2, rank=slot, local_rank=0, local_ranks=1,
                                  key=KEY, transport=network, stderr=io.StringIO(), poll_seconds=0.01))
    for step in (1, 2, 3, 4):
        for ckpt in ranks:
            with ckpt.save_files(step) as directory:
                (directory / "weights.bin").write_bytes(payload(ckpt.rank, step))
    for ckpt in ranks:
        ckpt.close(finished=False)
    node2 = tmp_path / "node2" / f"clusterctl-{os.getuid()}" / f"ckpt-{RUN_KEY}" / "node2"
    assert steps_in(node2 / "buddy" / "node1")[-1] == 4
    assert steps_in(shared / "tiers") == [3, 4], "step 3 is due; step 4 is flushed at the end"
    assert network.servers == {}, "close stops the copy servers"


def test_a_save_estimated_beyond_the_budget_goes_to_shared_storage(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100, budget=400)
    job.save(1)  # node1: its own ~120 bytes fit; then it keeps node2's ~190 bytes for it
    job.save(2)  # a second copy of ~120 bytes would not: to shared storage, said once
    job.save(3)
    assert steps_in(job.tier("node1") / "local") == [1]
    assert (job.shared / "tiers" / "step-000000000002" / "slot-000000" / "manifest.json").is_file()
    said = [line for line in job.stderr.getvalue().splitlines() if "node1: " in line]
    assert len(said) == 1 and "budget is 400 bytes" in said[0] and "saving step 2 to shared storage" in said[0]


def test_a_tier_index_without_this_slot_is_a_setup_error(tmp_path: Path) -> None:
    index = tmp_path / "tiers.idx"
    write_tier_index(index, None, [TierSlot(node="node1")])
    settings = CheckpointSettings(run_key=RUN_KEY, local_base=str(tmp_path), shared_dir=str(tmp_path / "shared"),
                                  tier_index=str(index), port=4711)
    with pytest.raises(CheckpointSetupError, match=r"slot 3\) of the tier index"):
        Checkpointer(settings, node="node4", slot=3, slots=4, rank=12, local_rank=0, local_ranks=4, key=KEY,
                     transport=FakeCopyNetwork())


def test_copies_move_over_the_real_tcp_transport(tmp_path: Path) -> None:
    """The default door: node `localhost` keeps node1's copy (pushed over TCP), and node3, taking node1's
    slot, fetches it back over TCP.  All three share this machine, so only the first server binds the
    port; the others say so and carry on (they push and fetch as clients)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    index = tmp_path / "launch" / "tiers.idx"
    shared = tmp_path / "checkpoints"

    def checkpointer(node: str, slot: int, local_rank: int, resume_step: int | None = None) -> Checkpointer:
        settings = CheckpointSettings(run_key=RUN_KEY, local_base=str(tmp_path / node), shared_dir=str(shared),
                                      tier_index=str(index), port=port, flush_every_steps=100,
                                      resume_step=resume_step)
        return Checkpointer(settings, node=node, slot=slot, slots=2, rank=slot * 2 + local_rank,
                            local_rank=local_rank, local_ranks=2, key=KEY, stderr=io.StringIO(), background=False,
                            timeout=10.0)

    write_tier_index(index, None, [TierSlot("node1", "localhost"), TierSlot("localhost", "node1")])
    keeper = checkpointer("localhost", 1, 0)
    node1 = [checkpointer("node1", 0, lr) for lr in (0, 1)]
    try:
        for ckpt in node1:
            with ckpt.save_files(5) as directory:
                (directory / f"rank-{ckpt.rank}.bin").write_bytes(payload(ckpt.rank, 5))
        node1[0].tend()
        kept = tmp_path / "localhost" / f"clusterctl-{os.getuid()}" / f"ckpt-{RUN_KEY}" / "localhost" / "buddy"
        assert steps_in(kept / "node1") == [5]
        holdings = read_holdings(kept.parent / "holdings.json")
        assert holdings is not None and [(c.tier, c.of_node, c.step) for c in holdings.copies] == \
            [("buddy", "node1", 5)]

        write_tier_index(index, 5, [TierSlot("node3", "localhost", "buddy", "node1", "localhost"),
                                    TierSlot("localhost", "node3", "local", "localhost", "localhost")])
        resume = checkpointer("node3", 0, 1, resume_step=5).resume()
        assert resume is not None and resume.step == 5
        assert [(resume.directory / f"rank-{r}.bin").read_bytes() for r in (0, 1)] == [payload(0, 5), payload(1, 5)]
    finally:
        for ckpt in (keeper, *node1):
            ckpt.close()


def test_what_a_crashed_save_left_never_gets_into_a_copy(tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100)
    crashed = job.tier("node1") / ".tmp-step-000000000001-0badc0de"  # the same step, an earlier attempt
    crashed.mkdir()
    (crashed / "rank-0.bin").write_text("half of an earlier attempt's file")
    job.save(1)
    manifest = read_checkpoint_manifest(job.tier("node1") / "local" / "step-000000000001" / "manifest.json")
    assert [s.name for s in manifest.shards] == ["rank-0.bin", "rank-1.bin"]
    assert (job.tier("node1") / "local" / "step-000000000001" / "rank-0.bin").read_bytes() == payload(0, 1)
    assert not crashed.exists()
    assert sorted(p.name for p in job.tier("node1").iterdir() if p.name.startswith(".tmp-")) == []


def test_a_replacement_node_waits_for_its_buddys_server_to_come_up_and_says_where_it_resumed_from(
        tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    saved_job(tmp_path, network, range(1, 4))
    network.gone.add("node1")
    network.starting["node2"] = 2  # node2's first rank starts its server a moment after node3 asks
    survivor = Job(tmp_path, network,
                   two_nodes("buddy", of=("node1", "node2"), held=("node2", "node2"), nodes=("node3", "node2")),
                   resume_step=3)
    resumed = survivor.ranks["node3"][0].resume()
    assert resumed is not None and resumed.source == "node1's copy on node2"
    assert (resumed.directory / "rank-0.bin").read_bytes() == payload(0, 3)
    assert "resuming step 3 on node3: slot 0's files from node1's copy on node2 in" in survivor.stderr.getvalue()
    assert survivor.ranks["node3"][1].resume() == resumed


def test_a_resume_drops_the_copies_the_failure_abandoned_so_no_checkpoint_mixes_two_timelines(
        tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    saved_job(tmp_path, network, range(1, 5), flush_every=100)  # node1 and node2 hold steps 3 and 4
    again = Job(tmp_path, network, two_nodes("local", of=("node1", "node2"), held=("node1", "node2")),
                resume_step=3, flush_every=100)
    for ranks in again.ranks.values():
        assert ranks[0].resume() is not None
    for node, buddy in (("node1", "node2"), ("node2", "node1")):
        assert steps_in(again.tier(node) / "local") == [3]
        assert steps_in(again.tier(node) / "buddy" / buddy) == [3]
    holdings = read_holdings(again.tier("node1") / "holdings.json")
    assert holdings is not None
    assert {(c.tier, c.step) for c in holdings.copies if c.tier != "shared"} == {("local", 3), ("buddy", 3)}


def test_a_save_returns_once_the_files_are_written_and_the_node_commits_them_in_the_background(
        tmp_path: Path) -> None:
    network = FakeCopyNetwork()
    job = Job(tmp_path, network, two_nodes(), flush_every=100)
    for ckpt in job.ranks["node1"]:  # every rank's part written: the save calls have returned ...
        with ckpt.save_files(7) as directory:
            (directory / f"rank-{ckpt.rank}.bin").write_bytes(payload(ckpt.rank, 7))
    assert steps_in(job.tier("node1") / "local") == [], "... before any shard was hashed or the copy committed"
    job.ranks["node1"][0].tend()  # the node's first rank's background round
    manifest = read_checkpoint_manifest(job.tier("node1") / "local" / "step-000000000007" / "manifest.json")
    assert [s.name for s in manifest.shards] == ["rank-0.bin", "rank-1.bin"] and manifest.save_seconds >= 0
