"""Real PyTorch on the testbed: examples/torch_trainer.py (DDP over gloo on CPU, DCP checkpoints) on
2 nodes x 2 emulated GPUs, launched by the real torchrun (static rendezvous, --node-rank from the
rank map) and by the srun style.  A GPU falls off the bus (Xid 79) or a rank dies mid-save; the
supervisor resumes from the last complete DCP checkpoint, or with a spare the job's agent swaps
the node inside the allocation (the rendezvous host included), and the run ends bit-identical to
an uninterrupted one.

The training program runs with this checkout's virtualenv, the one PyTorch is installed into, as a
user's environment on shared storage would be; on a release with its own root filesystem the testbed
lends it this machine's Python (`cluster.user_python`).  The multi-level checkpoint stories run on
every release; the others only on this machine's Slurm (CLUSTERCTL_TEST_SLURM=host)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.rank_record import read_rank_records
from clusterctl.records.run_journal import read_run_journal
from clusterctl.slurm import hostlist
from clusterctl_testbed.gpu_faults import Fault, inject
from tests.conftest import REPO, TEST_LAYOUT, TEST_SLURM, clusterctl_on

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="PyTorch is not installed: CLUSTERCTL_TORCH=1 bash scripts/setup.sh"),
]
host_only = pytest.mark.skipif(TEST_SLURM != "host", reason="a story of the launch styles and the supervisor, "
                               "told on this machine's Slurm (host); the multi-level checkpoint stories run everywhere")

RECORDS = str(TEST_LAYOUT.root / "job-health")
STEPS = 40


def _python(cluster) -> Path:
    """The training program's Python: this checkout's virtualenv, lent to the testbed's hosts."""
    python = getattr(cluster, "user_python", None)
    if python is None:
        pytest.skip(f"this machine's Python (under /usr) cannot be lent to the {TEST_SLURM} root filesystem, "
                    "and that has no PyTorch; run with CLUSTERCTL_TEST_SLURM=host")
    return python


def _spec(cluster, tmp_path: Path, style: str, *extra: str, spares: int = 0, exclude: str = "") -> Path:
    python = _python(cluster)
    command = [str(python), "torch_trainer.py", "--checkpoint-dir", "{checkpoint_dir}", "--steps", str(STEPS),
               "--checkpoint-every", "10", "--step-time", "0.25", "--timeout", "30", *extra]
    path = tmp_path / "job.toml"
    excluded = f'exclude = "{exclude}"\n' if exclude else ""
    path.write_text(f"""\
[job]
name = "torch-{style}"
nodes = 2
spare_nodes = {spares}
gpus_per_node = 2
{excluded}[launch]
style = "{style}"
command = {json.dumps(command)}
workdir = "{REPO / 'examples'}"
env = {{PATH = "{python.parent}:{cluster.bindir}:/usr/bin:/bin", OMP_NUM_THREADS = "1"}}
[parallel]
tp = 1
pp = 1
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "dcp"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
backoff_seconds = 0.5
max_program_failures = 1
""")
    return path


def _supervised(cluster, spec: Path, run_dir: Path) -> subprocess.Popen:
    argv = [*cluster.enter("ctl", cwd=str(REPO)), str(cluster.python), "-c",
            "from clusterctl.launcher.login.cli import main; main()",
            "submit", str(spec), "--run-dir", str(run_dir), "--supervise", "--job-records", RECORDS]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    _wait_until(path.exists, proc, timeout, f"{path} did not appear")


def _wait_until(condition, proc: subprocess.Popen, timeout: float = 120, what: str = "it did not happen in time") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the supervisor did not finish:\n{out}") from None
    return proc.returncode, out


def _events(run_dir: Path, kind: str) -> list:
    return [e for e in read_run_journal(run_dir / "journal.jsonl").events if e.event == kind]


def _final(run_dir: Path) -> dict:
    return json.loads((run_dir / "checkpoints" / "final.json").read_text())


def _log(run_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.out")))


def _agent_lines(run_dir: Path) -> str:
    """What the agent and the checkpoint library said in the job's log: why a step ended, how it recovered."""
    return "\n".join(line for line in _log(run_dir).splitlines() if line.startswith(("clusterctl", "srun")))


@pytest.fixture(scope="module")
def reference(testbed_session, tmp_path_factory) -> dict:
    """The same training uninterrupted (srun style, world size 4)."""
    failures = []
    for _ in range(2):
        tmp = tmp_path_factory.mktemp("torch-reference")
        run_dir = tmp / "run"
        done = clusterctl_on(testbed_session, "submit", str(_spec(testbed_session, tmp, "srun")), "--run-dir",
                             str(run_dir), "--wait", timeout=300, check=False)
        if done.returncode == 0 and (run_dir / "checkpoints" / "final.json").exists():
            break
        # Once in about ten CI runs a rank aborted in PyTorch's teardown after the run was done
        # ("terminate called without an active exception"; the others were then terminated: exit
        # 143).  The trainer now leaves with os._exit; should it still happen, the expected result
        # (not a story) comes from this run, so one more try is taken and the failure is shown.
        failures.append(f"{done.stdout}{done.stderr}\n{_log(run_dir)}")
        warnings.warn(f"the uninterrupted PyTorch reference run failed:\n{failures[-1]}", stacklevel=1)
    assert len(failures) < 2, "\n\n".join(failures)
    final = _final(run_dir)
    assert final["step"] == STEPS and final["world_size"] == 4
    return final


@host_only
@pytest.mark.matrix_only  # CI time: the xid 79 and the batch-host stories cover most of it
def test_srun_a_rank_killed_mid_save_leaves_a_dcp_checkpoint_the_supervisor_refuses(cluster, tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = _supervised(cluster, _spec(cluster, tmp_path, "srun", "--die-during-save", "20"), run_dir)
    code, out = _finish(proc)
    assert code == 0, out
    log = _log(run_dir)
    assert "killed during save" in log
    cut = run_dir / "checkpoints" / "step-00000020"
    assert f"skipping checkpoint {cut}: no .metadata (DCP writes it after every shard): incomplete" in out
    submitted, decided = _events(run_dir, "submitted"), _events(run_dir, "decided")
    assert len(submitted) == 2 and decided[0].outcome == "program-failure" and not decided[0].blame, out
    assert submitted[1].resume_from == str(run_dir / "checkpoints" / "step-00000010")
    assert _final(run_dir) == reference, out + log
    assert (cut / ".metadata").exists()  # saved again, completely, by the resumed job


@host_only
def test_torchrun_an_xid_79_mid_run_resumes_from_the_last_complete_dcp_checkpoint_bit_identical(
        cluster, tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = _supervised(cluster, _spec(cluster, tmp_path, "torchrun"), run_dir)
    _wait_for(run_dir / "checkpoints" / "step-00000010" / ".metadata", proc)
    job = _events(run_dir, "submitted")[0].job_id
    rank_map = read_rank_map(run_dir / "jobs" / job)
    broken = rank_map.slots[1]
    # Shards PyTorch wrote, without the .metadata that would end the save: a checkpoint cut off.
    torn = run_dir / "checkpoints" / "step-00000090"
    torn.mkdir()
    for shard in (run_dir / "checkpoints" / "step-00000010").glob("*.distcp"):
        shutil.copy(shard, torn / shard.name)
    inject(cluster.nvml_dir(broken), Fault("xid", gpu=1, value=79))
    code, out = _finish(proc)
    assert code == 0, out
    log = _log(run_dir)
    assert _final(run_dir) == reference, out + log

    submitted, decided = _events(run_dir, "submitted"), _events(run_dir, "decided")
    assert len(submitted) == 2 and [d.attempt for d in decided] == [1, 2], out
    first = decided[0]
    assert first.outcome == "node-failure" and first.action == "resubmit", out
    assert [b.node for b in first.blame] == [broken], out
    assert "xid 79" in " ".join(first.blame[0].evidence)
    assert f"skipping checkpoint {torn}: no .metadata (DCP writes it after every shard): incomplete" in out
    assert 10 <= first.checkpoint_step < STEPS
    assert submitted[1].resume_from == str(run_dir / "checkpoints" / f"step-{first.checkpoint_step:08d}")
    assert submitted[1].exclude == broken and broken not in read_rank_map(run_dir / "jobs" / submitted[1].job_id).slots
    assert f"resumed from {submitted[1].resume_from}" in log, log
    # Which comes first is a race the story does not depend on: the rank's next NVML check sees the
    # GPU lost (a step is 0.25 s, longer mid-save), or the job's agent hears healthd's drain from the
    # node's reporter and ends the step, or the supervisor sees the drain under the running job.
    assert ("CUDA error: GPU 1 is lost" in log or f"ending the step now: {broken}" in log
            or f"attempt 1: ending job {job} now: {broken}" in out), out + log
    # The real torchrun ran, one Slurm task per node, ranks node_rank x 2 + local rank, on the map's nodes.
    second = submitted[1].job_id
    records, again = read_rank_records(run_dir / "jobs" / second), read_rank_map(run_dir / "jobs" / second)
    assert {r: (rec.slurm_procid, rec.node) for r, rec in records.items()} == {
        r: (str(r // 2), again.location(r)[0]) for r in range(4)}
    assert decided[1].outcome == "completed" and _events(run_dir, "done")


@host_only
@pytest.mark.matrix_only  # CI time: the xid 79 and the batch-host stories cover most of it
def test_torchrun_with_a_spare_goes_on_on_it_when_the_rendezvous_host_fails_bit_identical_without_the_queue(
        cluster, tmp_path, reference):
    # Without node1 the allocation is node[2-4]: the map keeps node3 and node4 under one leaf, the
    # batch host node2 (where the agent runs) is the spare, and rank 0 / torchrun's rendezvous host
    # is node3, which then falls off the bus.
    run_dir = tmp_path / "run"
    proc = _supervised(cluster, _spec(cluster, tmp_path, "torchrun", spares=1, exclude="node1"), run_dir)
    _wait_for(run_dir / "checkpoints" / "step-00000010" / ".metadata", proc)
    job = _events(run_dir, "submitted")[0].job_id
    first = read_rank_map(run_dir / "jobs" / job)
    rendezvous = first.master_addr
    assert rendezvous == first.slots[0] and rendezvous != "node2" and first.unused_nodes == ("node2",), first
    inject(cluster.nvml_dir(rendezvous), Fault("xid", gpu=0, value=79))
    code, out = _finish(proc)
    assert code == 0, out
    log = _log(run_dir)
    assert _final(run_dir) == reference, out + log
    assert len(_events(run_dir, "submitted")) == 1, out + _agent_lines(run_dir)  # never back through the queue
    recovered = _events(run_dir, "recovered-in-allocation")
    assert len(recovered) == 1 and [b.node for b in recovered[0].blame] == [rendezvous], out
    assert recovered[0].given_back == (rendezvous,) and 10 <= recovered[0].checkpoint_step < STEPS, out
    again = read_rank_map(run_dir / "jobs" / job / "restart-1")
    assert rendezvous not in again.slots and "node2" in again.slots and again.master_addr == again.slots[0]
    # The real torchrun ran again, one Slurm task per node, on the new map's nodes.
    records = read_rank_records(run_dir / "jobs" / job / "restart-1")
    assert {r: (rec.slurm_procid, rec.node) for r, rec in records.items()} == {
        r: (str(r // 2), again.location(r)[0]) for r in range(4)}
    assert f"resumed from {recovered[0].checkpoint}" in log, log


@host_only
def test_torchrun_whose_batch_host_dies_goes_on_on_the_spare_bit_identical_without_the_queue(
        cluster, tmp_path, reference):
    """The node running the job's agent (and, in Slurm's order, rank 0 and torchrun's rendezvous
    host) is powered off: the standby agent on the spare takes the job over once Slurm takes the node
    out of the job and starts torchrun again on the survivor and the spare from the last DCP save."""
    run_dir = tmp_path / "run"
    proc = _supervised(cluster, _spec(cluster, tmp_path, "torchrun", spares=1), run_dir)
    _wait_for(run_dir / "checkpoints" / "step-00000010" / ".metadata", proc)
    job = _events(run_dir, "submitted")[0].job_id
    first = read_rank_map(run_dir / "jobs" / job)
    batch_host = hostlist.expand(first.nodelist)[0]
    cluster.kill_node(batch_host)
    code, out = _finish(proc)
    assert code == 0, out
    log = _log(run_dir)
    assert _final(run_dir) == reference, out + log
    assert len(_events(run_dir, "submitted")) == 1, out + _agent_lines(run_dir)  # never back through the queue
    (recovered,) = _events(run_dir, "recovered-in-allocation")
    assert recovered.took_over_from == batch_host and recovered.agent not in ("", batch_host), out
    assert [b.node for b in recovered.blame] == [batch_host] and 10 <= recovered.checkpoint_step < STEPS, out
    again = read_rank_map(run_dir / "jobs" / job / "restart-1")
    assert batch_host not in again.slots and again.master_addr == again.slots[0]
    assert f"resumed from {recovered.checkpoint}" in log, log


@pytest.mark.parametrize("corrupt", [False, pytest.param(True, marks=pytest.mark.one_release)],
                         ids=["buddy-copy", "corrupted-buddy-copy"])
def test_torchrun_with_multi_level_checkpoints_a_node_lost_before_the_flush_resumes_from_its_buddys_dcp_copy(
        cluster, tmp_path, reference, corrupt):
    """Every rank saves its DCP state to its node's memory (clusterctl.checkpoint), each node's part is
    copied to the other node, every k-th step flushed; a node powered off before its newest checkpoint
    reached shared storage: the spare takes its slot with the dead node's part fetched from its buddy.
    Corrupted: every copy of that part on the buddy has a flipped byte; the checksum catches it and the
    run goes on from the flushed checkpoint instead, without a restart loop."""
    from clusterctl.launcher.job.checkpoint_plan import run_key
    from clusterctl.records.checkpoint_holdings import read_holdings

    flush_every, newest = (20, 30) if corrupt else (30, 10)
    # A slower step (the result does not depend on it) leaves time to spoil the copies before the run ends.
    spec = _spec(cluster, tmp_path, "torchrun", *(["--step-time", "0.5"] if corrupt else []), spares=1)
    text = spec.read_text()
    spec.write_text(text[:text.index("[checkpoint]")] + '[checkpoint]\ndir = "{run_dir}/checkpoints"\ntiers = true\n'
                    f'flush_every_steps = {flush_every}\n' + text[text.index("[restart]"):])
    run_dir = tmp_path / "run"
    proc = _supervised(cluster, spec, run_dir)
    _wait_for(run_dir / "journal.jsonl", proc)
    _wait_until(lambda: _events(run_dir, "submitted"), proc)
    job = _events(run_dir, "submitted")[0].job_id
    _wait_for(run_dir / "jobs" / job / "rankmap.json", proc)
    slots = list(read_rank_map(run_dir / "jobs" / job).slots)
    batch_host = hostlist.expand(read_rank_map(run_dir / "jobs" / job).nodelist)[0]
    victim = next(n for n in slots if n != batch_host)
    survivor = next(n for n in slots if n != victim)
    tier = Path("/dev/shm") / "clusterctl-0" / f"ckpt-{run_key(run_dir)}"

    def kept_by_buddy() -> bool:
        # The victim's part on the survivor, and the survivor's own part of the same step: the victim's push can
        # land before the survivor's own save is complete (seen once in CI: the node was then killed with no
        # complete unflushed step anywhere, and the run rightly started again from the beginning).
        held = read_holdings(tier / survivor / "holdings.json")
        if held is None:
            return False
        own = {c.step for c in held.copies if c.tier == "local" and c.of_node == survivor}
        return any(c.tier == "buddy" and c.of_node == victim and c.step >= newest and c.step % flush_every and
                   c.step in own for c in held.copies)

    _wait_until(kept_by_buddy, proc)
    if corrupt:  # one byte flipped in the largest file of every copy of the victim's part on its buddy
        for step_dir in (tier / survivor / "buddy" / victim).glob("step-*"):
            shard = max((f for f in step_dir.rglob("*") if f.is_file() and not f.name.endswith(".json")),
                        key=lambda f: f.stat().st_size)
            data = bytearray(shard.read_bytes())
            data[len(data) // 2] ^= 0x01
            shard.write_bytes(bytes(data))
    cluster.kill_node(victim)
    code, out = _finish(proc)
    assert code == 0, out
    log = _log(run_dir)
    assert _final(run_dir) == reference, out + log
    assert len(_events(run_dir, "submitted")) == 1, out + _agent_lines(run_dir)  # never back through the queue
    recovered = _events(run_dir, "recovered-in-allocation")
    assert [b.node for b in recovered[0].blame] == [victim], out + log
    if not corrupt:
        assert len(recovered) == 1 and recovered[0].checkpoint_step % flush_every, out + log
        assert f"files from {victim}'s copy on {survivor} in" in log, log
    else:
        assert "fails its checksum" in log, log
        assert len(recovered) <= 3, log  # a bounded number of tries, never a loop
        assert recovered[-1].checkpoint_step == flush_every, out + log  # the flushed one, the newest complete
