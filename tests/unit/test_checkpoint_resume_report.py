"""Where a resume came from and how long the slowest node read, from the nodes to the agent's journal line,
as it goes on the testbed: a job of two nodes of two ranks with multi-level checkpoints; node2 is lost after
checkpoint 20 was saved and copied to the buddies, not flushed; the spare node3 takes its slot and fetches
node2's part from node1.  The real Checkpointer writes each node's tier in a temporary folder (the nodes
share one node-local base, as the testbed's nodes share /dev/shm), the real reporter of each node reads its
holdings and sends them over loopback UDP to the agent's inbox, and the agent's TierPlanner plans, writes
the tier index and says the `resumed` line (copies move between nodes through tests.fakes.FakeCopyNetwork;
no Slurm)."""

from __future__ import annotations

import fcntl
import threading
import time
from dataclasses import replace
from pathlib import Path

from clusterctl.checkpoint import Checkpointer, Resume
from clusterctl.clock import Clock
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender
from clusterctl.launcher.job.reporter import default_doors, report_settings, run_reporter
from clusterctl.launcher.job.signal_watch import SignalWatch
from clusterctl.launcher.pure.checkpoint_tiers import resumed_text
from clusterctl.launcher.pure.node_signals import SignalPolicy
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, read_holdings, write_holdings
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.run_journal import Resumed
from tests.fakes import FakeCopyNetwork

KEY = bytes(range(32))
JOB = "42"
RANKS_PER_NODE = 2
SPEC = """\
[job]
name = "tiers"
nodes = 2
spare_nodes = 1

[launch]
command = ["python3", "train.py"]

[checkpoint]
dir = "{run_dir}/checkpoints"
tiers = true
keep = 2
flush_every_steps = 40
"""


class Step:
    """One step of the job on `slots`: the agent's plan and tier index for it, every rank's Checkpointer
    (local rank 0 of a node does its background round when the test says), each node's reporter."""

    def __init__(self, tmp_path: Path, planner: TierPlanner, network: FakeCopyNetwork, launch: int,
                 slots: list[str], restart: int) -> None:
        self.tmp_path, self.planner, self.slots, self.launch = tmp_path, planner, slots, str(launch)
        launch_dir = planner.job_dir / f"launch-{launch}"
        launch_dir.mkdir(parents=True)
        self.env = planner.launch_env(launch_dir, slots, {})
        planner.step_started(restart, time.time())
        settings = CheckpointSettings.from_env(self.env)
        assert settings is not None
        self.ranks = {node: [Checkpointer(settings, node=node, slot=slot, slots=len(slots),
                                          rank=slot * RANKS_PER_NODE + lr, local_rank=lr, local_ranks=RANKS_PER_NODE,
                                          key=KEY, transport=network, attempt=f"{launch}-{node}", background=False)
                             for lr in range(RANKS_PER_NODE)]
                      for slot, node in enumerate(slots)}

    def save(self, step: int) -> None:
        for ranks in self.ranks.values():
            for ckpt in ranks:
                with ckpt.save_files(step) as directory:
                    (directory / f"rank-{ckpt.rank}.bin").write_bytes(f"rank {ckpt.rank} at {step}\n".encode() * 50)
        for ranks in self.ranks.values():
            ranks[0].tend()

    def resume(self) -> dict[str, Resume | None]:
        """Every rank asks for its resume; on the testbed the node's stager is whichever rank takes the lock first:
        here the second."""
        return {node: [ckpt.resume() for ckpt in reversed(ranks)][0] for node, ranks in self.ranks.items()}

    def reports(self) -> dict[str, CheckpointHoldings]:
        """Each node's reporter runs for a second of its own clock (sending what its node's holdings say at
        once, then with the heartbeat); the agent takes what arrived in its inbox."""
        inbox = ReportInbox(KEY, "127.0.0.1")
        watch = SignalWatch(inbox, JOB, self.launch, self.slots, SignalPolicy.for_nodes(len(self.slots)), time.time())
        try:
            for node in self.slots:
                reporter(self.tmp_path / "nodes" / node, inbox.port, {
                    **self.env, "CLUSTERCTL_REPORT_KEY": KEY.hex(), "CLUSTERCTL_REPORT_ADDR": f"127.0.0.1:{inbox.port}",
                    "CLUSTERCTL_REPORT_LAUNCH": self.launch, "CLUSTERCTL_REPORT_INTERVAL": "1", "SLURM_JOB_ID": JOB,
                    "SLURMD_NODENAME": node, "CLUSTERCTL_HEALTHD_STATE_DIR": "/nonexistent"})
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(watch.holdings()) < len(self.slots):
                watch.poll()
                time.sleep(0.01)
        finally:
            inbox.close()
        return watch.holdings()


def reporter(node_dir: Path, port: int, environ: dict[str, str]) -> None:
    node_dir.mkdir(parents=True, exist_ok=True)
    settings = report_settings(environ)
    sender = ReportSender(KEY, ("127.0.0.1", port))
    t = [0.0]
    clock = Clock(now=time.time, monotonic=lambda: t[0], sleep=lambda seconds: t.__setitem__(0, t[0] + seconds))
    try:
        run_reporter(settings, node_dir, 2**22 + 9, replace(default_doors(sender, lambda: t[0] >= 1.0, settings),
                                                            clock=clock))
    finally:
        sender.close()


def test_the_slowest_nodes_read_time_of_a_resume_reaches_the_agents_resumed_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job_dir = run_dir / "jobs" / JOB
    job_dir.mkdir(parents=True)
    said: list[str] = []
    planner = TierPlanner(run_dir, job_dir, parse_spec(SPEC, "job.toml", base_dir=tmp_path),
                          {"CLUSTERCTL_NODE_TMP": str(tmp_path / "shm")}, said.append)
    network = FakeCopyNetwork()

    assert planner.resume_point(["node1", "node2"]) is None
    first = Step(tmp_path, planner, network, 0, ["node1", "node2"], restart=0)
    assert first.resume() == {"node1": None, "node2": None}
    first.save(10)
    first.save(20)
    planner.observe(first.reports())

    network.gone.add("node2")  # powered off: the agent plans without it, the spare node3 takes its slot
    checkpoint = planner.resume_point(["node1", "node3"])
    assert checkpoint is not None and checkpoint.step == 20
    second = Step(tmp_path, planner, network, 1, ["node1", "node3"], restart=1)
    resumes = second.resume()
    own, fetched = resumes["node1"], resumes["node3"]
    assert own is not None and (own.step, own.tier) == (20, "local")
    assert fetched is not None and (fetched.step, fetched.tier, fetched.of_node, fetched.held_on) == \
        (20, "buddy", "node2", "node1")

    # What the agent does once per heartbeat while the step runs, and at the step's end if no line came before.
    holdings = second.reports()
    now = time.time()
    line = planner.resume_line(holdings, JOB, now) or planner.resume_line(holdings, JOB, now, step_ended=True)
    assert isinstance(line, Resumed)
    slowest = max(("node1", own.seconds), ("node3", fetched.seconds), key=lambda n: n[1])
    assert resumed_text(line) == (
        f"step 20: 1 node(s) from their own copies, 1 node(s) from a buddy's copy (node2's on node1); "
        f"read in {slowest[1]:.2f} s (slowest: {slowest[0]})")
    assert (line.restart, line.reported, line.nodes) == (1, 2, 2)


def test_a_resume_recorded_while_the_nodes_first_rank_rewrites_its_holdings_is_kept(tmp_path: Path) -> None:
    """On a node, the rank that stages the resume (whichever takes the stage lock) and local rank 0's
    background thread (after each save, push, flush, retention) are two processes rewriting one
    holdings.json: each reads the file for the resume it carries, then writes it back."""
    run_dir = tmp_path / "run"
    job_dir = run_dir / "jobs" / JOB
    job_dir.mkdir(parents=True)
    planner = TierPlanner(run_dir, job_dir, parse_spec(SPEC, "job.toml", base_dir=tmp_path),
                          {"CLUSTERCTL_NODE_TMP": str(tmp_path / "shm")}, [].append)
    network = FakeCopyNetwork()
    planner.resume_point(["node1", "node2"])
    first = Step(tmp_path, planner, network, 0, ["node1", "node2"], restart=0)
    first.resume()
    first.save(20)
    planner.observe(first.reports())
    planner.resume_point(["node1", "node2"])  # every node back (the job's step failed by itself)
    second = Step(tmp_path, planner, network, 1, ["node1", "node2"], restart=1)
    rank0, stager = second.ranks["node1"]
    assert rank0.tier is not None
    path = rank0.tier.holdings_path
    old = read_holdings(path)
    assert old is not None and old.last_resume is None

    # Local rank 0 rewrites the node's holdings under the node's holdings lock: it has read them (no resume
    # yet) and is about to write them back when the stager records the resume.
    staged: list[Resume | None] = []
    with open(rank0.tier.root / "holdings.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stager_thread = threading.Thread(target=lambda: staged.append(stager.resume()))
        stager_thread.start()
        stager_thread.join(0.5)  # the stager has staged (a small copy: well within this) and records its resume
        write_holdings(path, old)
    stager_thread.join()
    [resume] = staged
    held = read_holdings(path)
    assert resume is not None and held is not None and held.last_resume is not None, \
        "the stager's resume was overwritten by a rewrite that read the holdings before it"
    assert (held.last_resume.step, held.last_resume.tier) == (20, "local")
