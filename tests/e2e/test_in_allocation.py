"""Recovery inside the allocation on the real testbed: a job with a spare loses a node while the
queue is busy, gives the node back to Slurm and goes on on the spare from the last complete
checkpoint, without queueing again; the run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.rank_record import read_rank_records
from clusterctl_testbed.gpu_faults import Fault, inject
from tests.conftest import REPO, clusterctl_on
from tests.e2e.supervised_runs import RECORDS, finished, journal_events, squeue, supervised, wait_until

pytestmark = pytest.mark.e2e

STEPS = 60


def _spec(tmp_path: Path, spares: int) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""\
[job]
name = "spares"
nodes = 2
spare_nodes = {spares}
gpus_per_node = 8
sbatch_options = ["--exclusive"]
[launch]
command = ["python3", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "{STEPS}",
           "--checkpoint-every", "10", "--step-time", "0.15", "--log-every", "10", "--peer-timeout", "15"]
workdir = "{REPO / 'examples'}"
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
backoff_seconds = 0.5
""")
    return path


_events = journal_events
_wait = wait_until
_squeue = squeue
_supervised = supervised
_finished = finished


@pytest.fixture(scope="module")
def reference(testbed_session, tmp_path_factory) -> dict:
    """The same training on 2 nodes, uninterrupted (no spare)."""
    tmp = tmp_path_factory.mktemp("reference-2")
    clusterctl_on(testbed_session, "submit", str(_spec(tmp, 0)), "--run-dir", str(tmp / "run"), "--wait", timeout=180)
    final = json.loads((tmp / "run" / "checkpoints" / "final.json").read_text())
    assert final["step"] == STEPS
    return final


def test_an_xid_79_on_a_busy_queue_is_recovered_on_the_spare_without_queueing_again(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path, _spec(tmp_path, 1))
    _wait(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    slots = read_rank_map(run_dir / "jobs" / job).slots
    allocated = _squeue(cluster, "-j", job, "-o", "%N")
    # The queue is busy: the fourth node runs another job and one more waits for any node.
    cluster.run_on("ctl", ["sbatch", "-N1", "--exclusive", "-J", "filler", "--wrap", "sleep 300"])
    cluster.run_on("ctl", ["sbatch", "-N1", "--exclusive", "-J", "waiting", "--wrap", "sleep 300"])
    _wait(lambda: _squeue(cluster, "-n", "waiting", "-o", "%T") == "PENDING", "a pending job")
    broken = next(n for n in slots if n != _expand(cluster, allocated)[0])  # not the batch host: the agent runs there
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=3, value=79))
    _wait(lambda: _events(run_dir, "recovered-in-allocation"), "the in-allocation restart", proc=proc)
    # The new step runs on the spare while the other job still waits: nothing went back to the queue.
    queue = _squeue(cluster, "-o", "%i %j %T %N %R") + "\n" + cluster.run_on("ctl", ["sinfo", "-N", "-h"]).stdout
    assert _squeue(cluster, "-n", "waiting", "-o", "%T") == "PENDING", queue
    assert _squeue(cluster, "-j", job, "-o", "%T") == "RUNNING", queue
    out = _finished(cluster, proc)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    assert len(_events(run_dir, "submitted")) == 1, out  # never back through the queue
    recovered = _events(run_dir, "recovered-in-allocation")
    assert len(recovered) == 1, out
    event = recovered[0]
    assert [b.node for b in event.blame] == [broken] and event.given_back == (broken,), out
    assert broken not in event.nodes and set(event.nodes) <= set(_expand(cluster, allocated))
    assert event.checkpoint_step is not None and 20 <= event.checkpoint_step < STEPS
    assert "drained by healthd: healthd: xid 79 gpu3" in " ".join(event.blame[0].evidence)
    assert not list((REPO / "examples").glob(f"slurm_job_{job}_resize.*"))  # the user's workdir stays clean
    report = clusterctl_on(cluster, "report", str(run_dir)).stdout
    assert "restart 1 inside the allocation" in report and f"blamed {broken} (given back to Slurm)" in report


def _expand(cluster, nodes: str) -> list[str]:
    return cluster.run_on("ctl", ["scontrol", "show", "hostnames", nodes]).stdout.split()


def test_a_node_an_operator_drains_under_running_ranks_is_swapped_for_the_spare_within_2_s(cluster, tmp_path,
                                                                                         reference):
    proc, run_dir = _supervised(cluster, tmp_path, _spec(tmp_path, 1))
    _wait(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    batch_host = _expand(cluster, _squeue(cluster, "-j", job, "-o", "%N"))[0]
    victim = next(n for n in read_rank_map(run_dir / "jobs" / job).slots if n != batch_host)
    drained = time.time()
    cluster.run_on("ctl", ["scontrol", "update", f"NodeName={victim}", "State=DRAIN", "Reason=swap PSU (ticket 1234)"])
    _wait(lambda: _events(run_dir, "recovered-in-allocation"), "the swap", timeout=40, proc=proc)
    event = _events(run_dir, "recovered-in-allocation")[0]
    assert [(b.node, b.reason) for b in event.blame] == [(victim, "drained by an operator")], event
    assert "swap PSU (ticket 1234)" in event.blame[0].evidence[0], event
    seen = event.at - sum(seconds for _, seconds in event.phases)  # when the agent decided to end the step
    assert seen - drained <= 2.0, event
    out = _finished(cluster, proc)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    assert len(_events(run_dir, "submitted")) == 1 and victim not in event.nodes, out


@pytest.mark.one_release  # CI time: its Slurm side (a resubmission excluding a node) is the Xid story's
def test_when_no_spare_is_left_the_supervisor_resubmits_without_the_node(cluster, tmp_path, reference):
    proc, run_dir = _supervised(cluster, tmp_path, _spec(tmp_path, 1))
    _wait(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    batch_host = _expand(cluster, _squeue(cluster, "-j", job, "-o", "%N"))[0]  # the agent's: not the one to break
    second = next(n for n in read_rank_map(run_dir / "jobs" / job).slots if n != batch_host)
    inject(cluster.nvml_dir(second), Fault("xid", gpu=3, value=79))  # the spare takes its place ...
    _wait(lambda: _events(run_dir, "recovered-in-allocation"), "the in-allocation restart", proc=proc)
    restarted = read_rank_map(run_dir / "jobs" / job / "restart-1").slots
    _wait(lambda: (run_dir / "jobs" / job / "restart-1" / "ranks").is_dir()
          and len(list((run_dir / "jobs" / job / "restart-1" / "ranks").iterdir())) == 16, "the new step's ranks",
          proc=proc)
    spare = next(n for n in restarted if n != batch_host)
    inject(cluster.nvml_dir(spare), Fault("xid", gpu=2, value=79))  # ... and then fails too: no spare left
    out = _finished(cluster, proc, timeout=240)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    submitted = _events(run_dir, "submitted")
    assert len(submitted) == 2, out
    excluded = set(_expand(cluster, submitted[1].exclude or ""))
    assert {second, spare} <= excluded, out


@pytest.mark.one_release  # CI time: its Slurm side (a step ended and started again) is the spare stories'
def test_ranks_that_stop_progressing_are_caught_within_the_timeout_and_the_step_restarts(cluster, tmp_path,
                                                                                       reference):
    spec = _spec(tmp_path, 1).read_text()
    # The cluster's own Python, so the example reports its steps (clusterctl.progress); ranks stuck
    # past 5 s (5 x the learned step time, at least hang_min_step_seconds) count as hung.
    spec = spec.replace('command = ["python3"', f'command = ["{cluster.python}"').replace(
        '"--peer-timeout", "15"', '"--peer-timeout", "120"')
    spec += "hang_min_step_seconds = 5\nhang_startup_seconds = 60\n"
    (tmp_path / "job.toml").write_text(spec)
    proc, run_dir = _supervised(cluster, tmp_path, tmp_path / "job.toml")
    # Past the warm-up, with a few seconds of steps for the watch to learn the step time from.
    _wait(lambda: (run_dir / "checkpoints" / "step-00000040").exists(), "checkpoint 40", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    victim = read_rank_map(run_dir / "jobs" / job).slots[1]
    records = read_rank_records(run_dir / "jobs" / job).values()
    stopped = time.time()
    for record in records:
        if record.node == victim:
            os.kill(record.pid, signal.SIGSTOP)  # alive, holding its GPU, making no progress
    _wait(lambda: _events(run_dir, "recovered-in-allocation"), "the hang caught", timeout=40, proc=proc)
    event = _events(run_dir, "recovered-in-allocation")[0]
    phases = dict(event.phases)
    # Caught within the timeout and one watch interval; then the step's end: srun's cancel, which on
    # 26.05 once waited out the agent's whole 15 s grace (STOP_GRACE_SECONDS) for the stopped ranks.
    assert event.at - phases["end_step"] - stopped <= 5 + 2, event
    assert phases["end_step"] <= 15 + 2, event
    # Every rank stopped stepping at once (lockstep), but only the victim's processes stopped running:
    # the others' liveness threads kept reporting while they waited in the all-reduce, so the victim
    # is named, though rank 0's last report (a phase change after the save) came after the others'.
    assert [b.node for b in event.blame] == [victim], event
    assert "also stopped running" in event.blame[0].evidence[0], event
    # Why it hung, kept before the step was ended: every rank's Python stack (py-spy), grouped by where
    # it waits; the victim's stopped ranks are among those dumped or named with the reason they are not.
    stacks = "\n".join(event.stacks)
    assert "toy_trainer.py" in event.stacks[0], stacks  # where the waiting ranks are, in the program
    assert "stop first" in stacks or victim in stacks, stacks
    assert (run_dir / "jobs" / job / "stacks" / f"{victim}.json").exists(), event.stacks
    out = _finished(cluster, proc)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    assert len(_events(run_dir, "submitted")) == 1, out


# The cut link runs in CI under Slurm's default timeouts (its own session, alone), not also on the fast testbed:
# the job it gives the node back from owes the node an epilog that Slurm delivers minutes later, in whichever
# story runs then, where it drained the node for what healthd found in an earlier story (seen twice).
@pytest.mark.parametrize("fault", [pytest.param("cut-link", marks=[pytest.mark.one_release, pytest.mark.production,
                                                                  pytest.mark.matrix_only]),
                                   pytest.param("kill-batch-host", marks=pytest.mark.production_matrix)])
def test_a_node_that_dies_or_is_cut_off_is_replaced_by_the_spare(cluster, tmp_path, reference, fault):
    """... the batch host too, where the agent runs: its standby on the spare takes the job over once
    Slurm says the node is gone, and the run goes on there without a new sbatch.  (Another node
    powered off: tests/e2e/test_checkpoint_tiers.py, whose story is this one with multi-level
    checkpoints on.)"""
    proc, run_dir = _supervised(cluster, tmp_path, _spec(tmp_path, 1))
    _wait(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    batch_host = _expand(cluster, _squeue(cluster, "-j", job, "-o", "%N"))[0]  # where the agent runs
    victim = batch_host if fault == "kill-batch-host" else \
        next(n for n in read_rank_map(run_dir / "jobs" / job).slots if n != batch_host)
    (cluster.cut_link if fault == "cut-link" else cluster.kill_node)(victim)
    out = _finished(cluster, proc)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference, out
    assert len(_events(run_dir, "submitted")) == 1, out
    event = _events(run_dir, "recovered-in-allocation")[0]
    assert [b.node for b in event.blame] == [victim] and victim not in event.nodes, out
    if fault == "kill-batch-host":
        assert event.took_over_from == victim and event.agent not in ("", victim), out
        assert [e.outcome for e in _events(run_dir, "agent-ended")] == ["completed"], out
        assert "took it over from its dead batch host" in out, out


@pytest.mark.one_release  # CI time: its Slurm side is the kill-batch-host story's
def test_the_batch_host_and_the_supervisor_lost_at_once_nothing_acts_twice_and_the_run_ends_right(
        cluster, tmp_path, reference):
    """The node running the job's agent dies as the login session with the supervisor does: the
    standby on the spare takes the job over alone, finishes the run and ends the job; a supervisor
    attached afterwards finds the run completed by that job, and submits nothing."""
    proc, run_dir = _supervised(cluster, tmp_path, _spec(tmp_path, 1))
    _wait(lambda: (run_dir / "checkpoints" / "step-00000020").exists(), "checkpoint 20", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    batch_host = _expand(cluster, _squeue(cluster, "-j", job, "-o", "%N"))[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cluster.kill_node(batch_host)
    _wait(lambda: _events(run_dir, "agent-ended"), "the standby agent ending the job", timeout=180)
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text()) == reference
    (recovered,) = _events(run_dir, "recovered-in-allocation")
    assert recovered.took_over_from == batch_host and recovered.agent != batch_host
    again = subprocess.Popen([*cluster.enter("ctl", cwd=str(REPO)), str(cluster.python), "-c",
                              "from clusterctl.launcher.login.cli import main; main()", "supervise", str(run_dir),
                              "--job-records", RECORDS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = _finished(cluster, again)
    assert "run done" in out and len(_events(run_dir, "submitted")) == 1, out
    assert [e.outcome for e in _events(run_dir, "decided")] == ["completed"], out


def _rank0_step(job_dir: Path) -> int:
    """How far the job got: its ranks' progress files (a job without an agent), else the agent's
    summary (a job with spares: the ranks report to the agent, not to shared storage)."""
    from clusterctl.records.agent_summary import read_agent_summary
    from clusterctl.records.rank_progress import read_progress
    records, _ = read_progress(job_dir)
    if records:
        return max((r.step for r in records if r.rank == 0), default=0)
    summary = read_agent_summary(job_dir)
    return summary.min_step or 0 if summary is not None else 0


def _throttle(cluster, nodes, gpus, percent: int) -> None:
    for node in nodes:
        for gpu in gpus:
            inject(cluster.nvml_dir(node), Fault("throttle", gpu=gpu, value=percent))


def _straggler_run(cluster, tmp_path: Path, spares: int, steps: int, extra: str):
    """The example trainer (0.1 s a step, reporting its compute time) supervised with `extra` spec
    lines after [restart]; once rank 0 passed step 20: (process, run dir, job id, job dir)."""
    spec = _spec(tmp_path, spares).read_text()
    spec = spec.replace('command = ["python3"', f'command = ["{cluster.python}"').replace(
        f'"--steps", "{STEPS}"', f'"--steps", "{steps}"').replace('"--step-time", "0.15"', '"--step-time", "0.1"')
    (tmp_path / "job.toml").write_text(spec + extra)
    proc, run_dir = _supervised(cluster, tmp_path, tmp_path / "job.toml")
    _wait(lambda: (run_dir / "jobs").is_dir() and _events(run_dir, "submitted"), "the job", proc=proc)
    job = _events(run_dir, "submitted")[0].job_id
    job_dir = run_dir / "jobs" / job
    _wait(lambda: _rank0_step(job_dir) >= 20, "step 20", proc=proc)
    return proc, run_dir, job, job_dir


# Slurm's side (the evidence step, the straggler drain, a swap) runs everywhere in test_node_trust's evidence,
# test_drain_door's and the Xid swap stories.
@pytest.mark.one_release
def test_a_thermally_throttled_gpu_makes_its_node_a_straggler_swapped_for_the_spare_and_drained(cluster, tmp_path):
    """A whole-job slowdown and a short blip first: neither is a straggler.  Then one GPU of the
    second node keeps 40% of its clocks: its rank computes 2.5x slower, the node is found with its
    GPUs' evidence, drained (the evidence agrees), swapped for the spare from the last checkpoint,
    and the job's compute time per step is back to normal."""
    steps = 320
    proc, run_dir, job, job_dir = _straggler_run(cluster, tmp_path, 1, steps, '[stragglers]\naction = "swap"\n')
    slots = read_rank_map(job_dir).slots
    batch_host = _expand(cluster, _squeue(cluster, "-j", job, "-o", "%N"))[0]
    slow = next(n for n in slots if n != batch_host)
    # Every GPU of the job at 40% for 40 steps (a cooling failure of the whole row, say): nobody is a straggler.
    _throttle(cluster, slots, range(8), 40)
    start = _rank0_step(job_dir)
    _wait(lambda: _rank0_step(job_dir) >= start + 40, "40 slow steps", proc=proc)
    _throttle(cluster, slots, range(8), 100)
    # A blip: one GPU slowed for about 8 steps.
    _throttle(cluster, [slow], [3], 40)
    start = _rank0_step(job_dir)
    _wait(lambda: _rank0_step(job_dir) >= start + 8, "the blip", proc=proc)
    _throttle(cluster, [slow], [3], 100)
    # Long enough for two whole reads at full speed (the agent reads every 2 s, 20 steps): a read mixing
    # the blip's tail with normal steps neither extends nor ends a streak; a whole normal one ends it.
    start = _rank0_step(job_dir)
    _wait(lambda: _rank0_step(job_dir) >= start + 60, "normal steps again", proc=proc)
    assert not _events(run_dir, "straggler"), "a whole-job slowdown or a blip was called a straggler"
    # The real thing: one GPU stays throttled.
    throttled_at = _rank0_step(job_dir)
    _throttle(cluster, [slow], [3], 40)
    _wait(lambda: _events(run_dir, "recovered-in-allocation"), "the straggler swapped", timeout=90, proc=proc)
    out = _finished(cluster, proc, timeout=240)
    found = _events(run_dir, "straggler")
    assert len(found) == 1, out
    event = found[0]
    assert event.node == slow and event.action == "swapped" and 2.0 <= event.ratio <= 3.2, event
    # The stretch starts with the first slow read, which may have begun before the throttle: up to one
    # read (2 s, 20 normal steps) earlier.  Or later: `throttled_at` is the agent's summary, up to one
    # summary (2 s, 20 steps) old, and the read straddling the throttle may sit between the margins, so
    # the stretch starts with the next read (up to 20 steps on).  Either way not at the blip, 60 steps or more back.
    assert throttled_at - 21 <= event.since_step <= throttled_at + 41, event
    assert any("GPU 3" in line and "thermal" in line.lower() for line in event.hardware), event
    assert event.drain.startswith("drained: clusterctl straggler: slow-gpus "), event
    reason = cluster.run_on("ctl", ["sinfo", "-h", "-n", slow, "-o", "%E"]).stdout.strip()
    assert reason.startswith("clusterctl straggler: slow-gpus "), reason
    recovered = _events(run_dir, "recovered-in-allocation")[0]
    assert [b.node for b in recovered.blame] == [slow] and slow not in recovered.nodes, out
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text())["step"] == steps, out
    # The new step runs at the job's normal speed: nobody slow, nothing more lost.
    from clusterctl.records.node_step_times import read_node_step_times
    table = read_node_step_times(job_dir)
    assert table is not None and slow not in [n.node for n in table.nodes], table
    assert all(n.state == "ok" for n in table.nodes) and table.reference is not None and table.reference < 0.15, table
    status = clusterctl_on(cluster, "status", str(run_dir)).stdout
    assert f"straggler {slow}" in status and "compute time per step" in status, status
    report = clusterctl_on(cluster, "report", str(run_dir)).stdout
    assert f"straggler {slow} (swapped)" in report and "slow nodes" in report, report


@pytest.mark.one_release  # the same Slurm side as the thermal straggler's and the resubmission stories'
def test_without_spares_the_supervisor_finds_the_straggler_drains_it_and_excludes_it_from_the_next_submission(
        cluster, tmp_path):
    """No spare, so no agent: the supervisor reads the ranks' progress from the run directory.  One GPU
    keeps 40% of its clocks: the node is found with its GPUs' evidence, drained (the evidence agrees),
    and blamed so a resubmission would leave it out; the job itself runs on to its end."""
    steps = 200
    proc, run_dir, _, job_dir = _straggler_run(cluster, tmp_path, 0, steps,
                                               'poll_max_seconds = 2\n[stragglers]\naction = "exclude"\n')
    slow = read_rank_map(job_dir).slots[1]
    _throttle(cluster, [slow], [3], 40)
    _wait(lambda: _events(run_dir, "straggler"), "the straggler found", timeout=90, proc=proc)
    out = _finished(cluster, proc, timeout=240)
    [event] = _events(run_dir, "straggler")
    assert event.node == slow and event.action == "excluded" and 2.0 <= event.ratio <= 3.2, event
    assert [b.node for b in event.blame] == [slow], event
    assert any("GPU 3" in line and "thermal" in line.lower() for line in event.hardware), event
    assert event.drain.startswith("drained: clusterctl straggler: slow-gpus "), event
    reason = cluster.run_on("ctl", ["sinfo", "-h", "-n", slow, "-o", "%E"]).stdout.strip()
    assert reason.startswith("clusterctl straggler: slow-gpus "), reason
    assert f"straggler {slow}" in out, out
    assert json.loads((run_dir / "checkpoints" / "final.json").read_text())["step"] == steps, out
    assert len(_events(run_dir, "submitted")) == 1, out
    status = clusterctl_on(cluster, "status", str(run_dir)).stdout
    assert f"straggler {slow}" in status and "compute time per step" in status, status
