"""A node's reporter: the ranks report to node-local files, one process per node reads them with /proc
and healthd's state, and the agent's inbox hears one signed report per node, at once on a change."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import time_machine
from hypothesis import given, strategies as st

from clusterctl.clock import Clock
from clusterctl.errors import ClusterctlError
from clusterctl.launcher.job.report_channel import ReportInbox, ReportSender
from clusterctl.launcher.job.reporter import (
    GpuModel, HoldingsReader, ReporterDoors, ReporterSettingError, default_doors, read_node_health,
    read_node_progress, read_process_state, report_settings, run_reporter,
)
from clusterctl.launcher.pure.node_report_build import (
    ReporterIdentity, ReporterMemory, next_report, node_health, node_metrics, process_state, reported_holdings,
)
from clusterctl.records.checkpoint_holdings import (
    CheckpointHoldings, CopyRefusals, HeldCopy, LastResume, write_holdings)
from clusterctl.node_dir import node_dir
from clusterctl.progress import beat
from clusterctl.records.actions import Action
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding, state_path, write_healthd_state
from clusterctl.records.node_report import MAX_DATAGRAM, NodeHealth, NodeReport, decode, encode
from clusterctl.records.peer_beat import PeerBeat
from clusterctl.records.rank_progress import PHASES, RankProgress, read_progress, write_rank_progress

REPO = Path(__file__).resolve().parents[2]
KEY = bytes(range(32))
T0 = 1_800_000_000.0
IDENTITY = ReporterIdentity("4242", "0", "node7")


# ---- the ranks write to the node, not to shared storage --------------------------------------------

def test_a_rank_in_an_agents_step_reports_to_its_node_not_to_the_shared_job_dir(tmp_path, monkeypatch):
    job_dir, here = tmp_path / "job", tmp_path / "node"
    monkeypatch.setenv("CLUSTERCTL_JOB_DIR", str(job_dir))
    monkeypatch.setenv("CLUSTERCTL_NODE_DIR", str(here))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    beat(12, min_interval=0)
    (record,), problems = read_progress(here)
    assert (record.rank, record.step, record.node, problems) == (3, 12, "node7", ())
    assert not (job_dir / "progress").exists()

    monkeypatch.delenv("CLUSTERCTL_NODE_DIR")  # a job without an agent: the job dir, as before
    beat(13, min_interval=0)
    assert [r.step for r in read_progress(job_dir)[0]] == [13]


# ---- the node-local directory ----------------------------------------------------------------------

def test_the_node_dir_is_made_private_under_the_chosen_base(tmp_path):
    path = node_dir("4242", "restart-1", "node7", {"CLUSTERCTL_NODE_TMP": str(tmp_path)})
    assert path == tmp_path / f"clusterctl-{os.getuid()}" / "4242" / "restart-1" / "node7" and path.is_dir()
    assert (tmp_path / f"clusterctl-{os.getuid()}").stat().st_mode & 0o777 == 0o700
    assert node_dir("4242", "restart-1", "node7", {"CLUSTERCTL_NODE_TMP": str(tmp_path)}) == path  # reused


def test_a_planted_symlink_in_place_of_the_users_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / f"clusterctl-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(ClusterctlError, match="a symlink, not a real directory.*planted by another user"):
        node_dir("4242", "0", "node7", {"CLUSTERCTL_NODE_TMP": str(tmp_path)})
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder owned by another user takes root")
def test_a_folder_planted_by_another_user_is_refused(tmp_path):
    planted = tmp_path / f"clusterctl-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, 4321, 4321)
    with pytest.raises(ClusterctlError, match="owned by uid 4321.*refusing"):
        node_dir("4242", "0", "node7", {"CLUSTERCTL_NODE_TMP": str(tmp_path)})


def test_a_job_id_that_is_not_a_plain_name_is_refused(tmp_path):
    with pytest.raises(ClusterctlError, match="job id '../x' is not a plain file name"):
        node_dir("../x", "0", "node7", {"CLUSTERCTL_NODE_TMP": str(tmp_path)})


# ---- a rank's process as /proc shows it -------------------------------------------------------------

def test_a_stopped_process_reads_stopped_then_running_then_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert read_process_state(child.pid) == "running"
        os.kill(child.pid, signal.SIGSTOP)
        assert wait_for(lambda: read_process_state(child.pid) == "stopped")
        os.kill(child.pid, signal.SIGCONT)
        assert wait_for(lambda: read_process_state(child.pid) == "running")
    finally:
        child.kill()
        child.wait()
    assert read_process_state(child.pid) == "gone"


def test_the_state_is_read_after_the_last_parenthesis_of_the_command_name():
    assert process_state("1234 (evil) T (name) S 1 1234 1234 0 -1") == "running"
    assert process_state("1234 (a) R (b) T 1 1234 1234 0 -1") == "stopped"
    assert process_state("1234 (py-spy target) t 1 1234") == "running"  # a tracer's stop: a moment
    assert process_state("1234 (python) Z 1 1234") == "gone"
    assert process_state("garbage") == "unknown"


# ---- when a report goes out -------------------------------------------------------------------------

def progress(rank: int, step: int = 10, phase: str = "step", pid: int = 1000) -> RankProgress:
    return RankProgress(rank, "node7", step, phase, T0, pid + rank, 1.0, step, T0)


def test_a_change_the_agent_acts_on_goes_at_once_and_the_rest_waits_for_the_heartbeat():
    ranks = [progress(0), progress(1)]
    running = {r.pid: "running" for r in ranks}
    ok = NodeHealth("ok", (), T0)
    sent: list[NodeReport] = []
    memory = ReporterMemory()

    def look(at: float, records, processes=running, health=ok) -> bool:
        nonlocal memory
        decision = next_report(IDENTITY, records, processes, health, memory, now=T0 + at, monotonic=at, heartbeat=5.0)
        memory = decision.memory
        if decision.report is not None:
            sent.append(decision.report)
            memory = memory.after_send(decision.report, at, delivered=True)
        return decision.report is not None

    assert look(0.0, ranks)  # the first report
    assert not look(0.25, [progress(0, 11), progress(1, 11)])  # steps alone wait for the heartbeat
    assert look(5.0, [progress(0, 11), progress(1, 11)])  # ...which carries them
    assert look(5.25, [progress(0, 12, "checkpoint-save"), progress(1, 12)])  # a phase: at once
    stopped = {**running, ranks[1].pid: "stopped"}
    assert look(5.5, [progress(0, 12, "checkpoint-save"), progress(1, 12)], stopped)  # a stopped rank: at once
    assert not look(5.75, [progress(0, 12, "checkpoint-save"), progress(1, 12)], stopped)
    assert look(6.0, [progress(0, 12, "checkpoint-save"), progress(1, 12)], stopped,
                NodeHealth("drain", ("healthd: xid 79 gpu1",), T0))  # healthd's verdict: at once
    assert look(6.25, [progress(0, 12, "checkpoint-save"), progress(1, 12), progress(2)],
                {**stopped, progress(2).pid: "running"})  # a rank that appeared: at once

    assert [r.seq for r in sent] == [1, 2, 3, 4, 5, 6]
    assert sent[1].ranks[0].progress.step == 11
    beat_1 = sent[3].ranks[1]
    assert (beat_1.process, beat_1.stopped_since) == ("stopped", T0 + 5.5)
    assert sent[4].ranks[1].stopped_since == T0 + 5.5  # still the time it was first seen stopped
    assert sent[0].ranks[1].stopped_since == 0.0


def test_what_the_agent_acts_on_at_once_is_sent_again_twice_so_one_lost_datagram_does_not_wait_a_heartbeat():
    ranks = [progress(0), progress(1)]
    running = {r.pid: "running" for r in ranks}
    memory, reasons, ok = ReporterMemory(), [], NodeHealth("ok", (), T0)

    def look(at: float, records=ranks, processes=running, health=ok) -> None:
        nonlocal memory
        decision = next_report(IDENTITY, records, processes, health, memory, now=T0 + at, monotonic=at, heartbeat=20.0)
        memory = decision.memory
        if decision.report is not None:
            reasons.append((at, decision.reason))
            memory = memory.after_send(decision.report, at, delivered=True)

    for tick in range(0, 13):  # the first report, then a phase change at 1.0 s: sent once
        look(tick * 0.25, [progress(0, phase="checkpoint-save" if tick >= 4 else "step"), progress(1)])
    assert [at for at, _ in reasons] == [0.0, 1.0], reasons
    reasons.clear()
    for tick in range(13, 30):  # healthd drains at 3.25 s: sent at once, then twice more, 0.5 s apart
        look(tick * 0.25, [progress(0, phase="checkpoint-save"), progress(1)],
             health=NodeHealth("drain", ("healthd: xid 79 gpu1",), T0))
    assert [at for at, _ in reasons] == [3.25, 3.75, 4.25], reasons
    assert reasons[1][1] == reasons[2][1] == "again: what changed is sent more than once"


@given(st.lists(st.tuples(st.sampled_from(PHASES), st.sampled_from(["running", "stopped", "gone", "unknown"]),
                          st.sampled_from(["ok", "drain", "unknown"]), st.booleans()), max_size=30))
def test_reports_count_up_by_one_and_a_rank_stays_dated_from_when_it_first_stopped(looks):
    memory, seqs, first_down = ReporterMemory(), [], None
    for tick, (phase, state, verdict, delivered) in enumerate(looks):
        decision = next_report(IDENTITY, [progress(0, tick, phase)], {progress(0).pid: state}, NodeHealth(verdict),
                               memory, now=T0 + tick, monotonic=tick * 0.25, heartbeat=1.0)
        memory = decision.memory
        first_down = None if state not in ("stopped", "gone") else (first_down or T0 + tick)
        if decision.report is not None:
            assert decision.report.ranks[0].stopped_since == (first_down or 0.0)
            seqs.append(decision.report.seq)
            memory = memory.after_send(decision.report, tick * 0.25, delivered=delivered)
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_report_that_failed_to_leave_is_tried_again_within_a_second_not_a_heartbeat():
    records = [progress(0)]
    decision = next_report(IDENTITY, records, {}, NodeHealth(), ReporterMemory(), now=T0, monotonic=0, heartbeat=20)
    assert decision.report is not None
    memory = decision.memory.after_send(decision.report, 0, delivered=False)
    assert next_report(IDENTITY, records, {}, NodeHealth(), memory, now=T0, monotonic=0.5, heartbeat=20).report is None
    again = next_report(IDENTITY, records, {}, NodeHealth(), memory, now=T0, monotonic=1.0, heartbeat=20).report
    assert again is not None and again.seq == 2


def test_a_node_with_more_ranks_than_a_report_holds_sends_the_first_64():
    records = [progress(rank) for rank in range(100, 0, -1)]
    decision = next_report(IDENTITY, records, {}, NodeHealth(), ReporterMemory(), now=T0, monotonic=0, heartbeat=1)
    assert decision.report is not None
    assert [b.progress.rank for b in decision.report.ranks] == list(range(1, 65))


def test_a_full_node_with_long_healthd_evidence_still_fits_one_datagram(tmp_path):
    many = [replace(XID_79, gpu=None, reason="é" * 2000, at_ts=T0 + i) for i in range(40)]
    write_healthd_state(tmp_path, healthd(T0, *many))
    health = read_node_health(tmp_path, T0)
    records = [RankProgress(rank, "node7", 10**12, "checkpoint-save", T0 + 0.123456, 4_000_000 + rank,
                            123456.123456, 10**12, T0 + 0.123456) for rank in range(64)]
    report = next_report(IDENTITY, records, {}, health, ReporterMemory(), now=T0, monotonic=0, heartbeat=1).report
    assert report is not None and len(report.ranks) == 64 and report.health.verdict == "drain"
    kept = report.health.evidence  # the first reasons, as many as fit (ranks go as columns: about two of 40 here)
    assert 1 <= len(kept) < len(health.evidence) and kept == health.evidence[:len(kept)]
    assert len(encode(report, KEY)) <= MAX_DATAGRAM and decode(encode(report, KEY), KEY, "test") == report


# ---- healthd's verdict ------------------------------------------------------------------------------

def healthd(updated_at: float, *findings: StateFinding, dry_run: bool = False) -> HealthdState:
    gpus = tuple(GpuState(f.gpu, f"GPU-{f.gpu}", f"0000:{0x18 + f.gpu:02x}:00", (f,))
                 for f in findings if f.gpu is not None)
    node_findings = tuple(f for f in findings if f.gpu is None)
    return HealthdState(node="node7", pid=1, policy_version="2026.11.1", updated_at=updated_at,
                        started="2026-11-22T00:00:00Z", nvml_ok=True, gpus=gpus, node_findings=node_findings,
                        dry_run=dry_run)


XID_79 = StateFinding(kind="xid", xid=79, action=Action.DRAIN_REBOOT, reason="GPU has fallen off the bus\x1b[2J",
                      source="nvml-event", at_ts=T0, gpu=3)
WARNING = StateFinding(kind="thermal", action=Action.WARN, reason="", source="periodic", at_ts=T0, gpu=1)


def test_healthd_draining_the_node_is_sent_with_its_evidence(tmp_path):
    write_healthd_state(tmp_path, healthd(T0 - 5, XID_79, WARNING))
    assert read_node_health(tmp_path, T0) == NodeHealth(
        "drain", ("healthd: xid 79 gpu3: GPU has fallen off the bus\\x1b[2J",), T0 - 5)


def test_healthd_in_dry_run_or_with_only_warnings_says_ok(tmp_path):
    write_healthd_state(tmp_path, healthd(T0 - 5, XID_79, dry_run=True))
    assert read_node_health(tmp_path, T0).verdict == "ok"
    write_healthd_state(tmp_path, healthd(T0 - 5, WARNING))
    assert read_node_health(tmp_path, T0) == NodeHealth("ok", (), T0 - 5)


def test_healthd_stale_missing_or_garbled_says_unknown_without_failing(tmp_path):
    write_healthd_state(tmp_path, healthd(T0 - 31, XID_79))
    assert read_node_health(tmp_path, T0).verdict == "unknown"
    assert read_node_health(tmp_path / "none", T0) == NodeHealth("unknown", (), 0.0)
    state_path(tmp_path).write_bytes(b"\x00\xff{not json")
    assert read_node_health(tmp_path, T0) == NodeHealth("unknown", (), 0.0)


def test_evidence_is_cut_to_what_a_report_carries(tmp_path):
    many = [replace(XID_79, gpu=None, reason="x" * 2000, at_ts=T0 + i) for i in range(40)]
    write_healthd_state(tmp_path, healthd(T0, *many))
    health = read_node_health(tmp_path, T0)
    assert health.verdict == "drain" and len(health.evidence) == 16 and {len(e) for e in health.evidence} == {512}


# ---- the reporter's loop, to a real inbox -------------------------------------------------------------

class FakeClock:
    """The reporter's clock: sleeping moves time on at once."""

    def __init__(self) -> None:
        self.t = 0.0

    def clock(self) -> Clock:
        def sleep(seconds: float) -> None:
            self.t += seconds
        return Clock(now=lambda: T0 + self.t, monotonic=lambda: self.t, sleep=sleep)


def settings_env(port: int, **more: str) -> dict[str, str]:
    return {"CLUSTERCTL_REPORT_KEY": KEY.hex(), "CLUSTERCTL_REPORT_ADDR": f"127.0.0.1:{port}",
            "CLUSTERCTL_REPORT_LAUNCH": "restart-2", "CLUSTERCTL_REPORT_INTERVAL": "1", "SLURM_JOB_ID": "4242",
            "SLURMD_NODENAME": "node7", "CLUSTERCTL_HEALTHD_STATE_DIR": "/nonexistent", **more}


def drain_until(inbox: ReportInbox, enough) -> list[NodeReport]:
    got: list[NodeReport] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not enough(got):
        got += inbox.drain()
        time.sleep(0.01)
    return got


@pytest.mark.parametrize("inbox_key, heard", [(KEY, True), (bytes(range(100, 132)), False)], ids=["the-jobs-key", "another-key"])
def test_the_reporter_sends_its_ranks_to_the_agents_inbox_signed_with_the_jobs_key(tmp_path, inbox_key, heard):
    for record in (RankProgress(0, "node7", 41, "step", T0, os.getpid()),
                   RankProgress(1, "node7", 40, "checkpoint-save", T0, 2**22 + 7)):  # a pid that is no process
        write_rank_progress(tmp_path, record)
    inbox = ReportInbox(inbox_key, "127.0.0.1")
    fake = FakeClock()
    sender = ReportSender(KEY, ("127.0.0.1", inbox.port))
    watched, watched_gone_at = 2**22 + 9, 3.0  # the program of the task that started the reporter

    def states(pid: int) -> str:
        if pid == watched:
            return "gone" if fake.t >= watched_gone_at else "running"
        return read_process_state(pid)

    doors = ReporterDoors(fake.clock(), read_node_progress, states, read_node_health, sender.send)
    try:
        assert run_reporter(report_settings(settings_env(inbox.port)), tmp_path, watched, doors) == 0
        assert watched_gone_at + 2 <= fake.t < watched_gone_at + 2.5  # ended 2 s after its rank's program
        got = drain_until(inbox, lambda got: len(got) >= 6 or inbox.refused)
    finally:
        inbox.close()
        sender.close()
    if not heard:
        assert got == [] and inbox.refused["unsigned"] >= 1
        return
    first = got[0]
    assert (first.job_id, first.launch, first.node, first.seq) == ("4242", "restart-2", "node7", 1)
    assert [(b.progress.rank, b.progress.step, b.progress.phase, b.process) for b in first.ranks] == [
        (0, 41, "step", "running"), (1, 40, "checkpoint-save", "gone")]
    assert first.ranks[1].stopped_since == T0 and first.health.verdict == "unknown"
    assert [r.seq for r in got] == list(range(1, len(got) + 1))  # heartbeats each second, then the last one


def test_a_bad_report_interval_is_one_clear_line_and_exit_2(tmp_path):
    env = {**os.environ, **settings_env(9), "CLUSTERCTL_NODE_DIR": str(tmp_path), "CLUSTERCTL_REPORT_INTERVAL": "nan"}
    done = subprocess.run([sys.executable, "-m", "clusterctl.launcher.job", "reporter", "--watch-pid", "1"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["clusterctl reporter: CLUSTERCTL_REPORT_INTERVAL: 'nan' is not a number of "
                                        "seconds (finite, not negative); not reporting"]


def test_a_reporter_told_to_stop_sends_its_last_report_and_exits_cleanly(tmp_path):
    write_rank_progress(tmp_path, RankProgress(0, "node7", 5, "step", time.time(), os.getpid()))
    inbox = ReportInbox(KEY, "127.0.0.1")
    env = {**os.environ, **settings_env(inbox.port), "CLUSTERCTL_NODE_DIR": str(tmp_path),
           "CLUSTERCTL_REPORT_INTERVAL": "60"}
    reporter = subprocess.Popen([sys.executable, "-m", "clusterctl.launcher.job", "reporter", "--watch-pid",
                                 str(os.getpid())], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert [r.seq for r in drain_until(inbox, lambda got: len(got) >= 1)] == [1]  # the first report
        reporter.send_signal(signal.SIGTERM)
        assert reporter.wait(timeout=10) == 0 and reporter.stderr is not None and reporter.stderr.read() == ""
        assert [r.seq for r in drain_until(inbox, lambda got: len(got) >= 1)] == [2]  # the last, before the heartbeat
    finally:
        reporter.kill()
        reporter.wait()
        inbox.close()


@pytest.mark.parametrize("variable, value, said", [
    ("CLUSTERCTL_REPORT_KEY", "abc", "not hexadecimal"), ("CLUSTERCTL_REPORT_ADDR", "nohost", "not host:port"),
    ("CLUSTERCTL_REPORT_INTERVAL", "-1", "not a number"), ("SLURM_JOB_ID", "", "not set"),
    ("SLURMD_NODENAME", "-rf", "-rf"),
])
def test_each_bad_setting_names_its_variable(variable, value, said):
    with pytest.raises(ReporterSettingError) as caught:
        report_settings({**settings_env(9), variable: value})
    assert str(caught.value).startswith(f"{variable}: ") and said in str(caught.value)


# ---- the rank wrapper starts one reporter per node ------------------------------------------------------

def test_the_first_task_of_a_node_starts_its_reporter_which_reports_the_program_and_ends_after_it(tmp_path):
    job_dir = planned_job(tmp_path)
    from clusterctl.records.rank_map import read_rank_map
    slots = read_rank_map(job_dir).slots
    inbox = ReportInbox(KEY, "127.0.0.1")
    program = "from clusterctl.progress import beat; import time; beat(7); time.sleep(1.5)"
    env = {**os.environ, **settings_env(inbox.port), "CLUSTERCTL_NODE_TMP": str(tmp_path / "tmp"),
           "SLURM_PROCID": "8", "SLURM_LOCALID": "0", "SLURMD_NODENAME": slots[1], "CUDA_VISIBLE_DEVICES": "",
           "CLUSTERCTL_PROGRESS_LIVENESS": "0"}
    try:
        done = subprocess.run([sys.executable, "-m", "clusterctl.launcher.job", "rank", "--job-dir", str(job_dir),
                               "--", sys.executable, "-c", program], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=60)
        assert done.returncode == 0, done.stderr
        got = drain_until(inbox, lambda got: any(b.process == "gone" for r in got for b in r.ranks))
    finally:
        inbox.close()
    assert got and {r.node for r in got} == {slots[1]}, done.stderr
    # The reporter may speak once before the program's first beat (a loaded machine): an empty report.
    assert [(b.progress.rank, b.progress.step) for b in next(r for r in got if r.ranks).ranks] == [(8, 7)]
    assert got[-1].ranks[0].process == "gone"  # the last report: the program ended
    here = tmp_path / "tmp" / f"clusterctl-{os.getuid()}" / "4242" / "restart-2" / slots[1]
    assert not (job_dir / "progress").exists()  # the rank's progress stayed on its node...
    assert wait_for(lambda: not here.exists())  # ...and goes with the step: tmpfs is the node's memory


def planned_job(tmp_path: Path) -> Path:
    """A run planned on node[1-4] (toy trainer, recorded topology), as the job's `plan` step leaves it."""
    from clusterctl.launcher.job.steps import plan_for_job
    from clusterctl.launcher.login.submit import prepare
    from clusterctl.launcher.pure.render import SlurmFacts
    from clusterctl.launcher.pure.spec import load_spec
    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.slurm.commands import Completed, Slurm
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    run = create_run(tmp_path / "run", spec, "")
    prepare(spec, SlurmFacts(), run_dir=str(run.path), python=sys.executable)
    topology = (REPO / "tests" / "data" / "slurm" / "scontrol-show-topology.txt").read_text()
    job_dir = run.job_dir("4242")
    plan_for_job(run.path, job_dir, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-4]"},
                 Slurm(lambda argv, timeout: Completed(0, topology, "")))
    return job_dir


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True



# ---- the node's checkpoint holdings (multi-level checkpoints) ------------------------------------------

def held_copies(count: int, node: str = "node7") -> CheckpointHoldings:
    return CheckpointHoldings(node, tuple(HeldCopy(100 * (i + 1), node, "local", 0, 4, T0 + i + 0.0004, 1.23456)
                                          for i in range(count)), T0 + count)


def test_new_holdings_go_at_once_unchanged_ones_ride_the_heartbeat_and_only_the_newest_32_are_sent():
    records = [progress(0)]
    memory, sent = ReporterMemory(), []

    def look(at: float, held: CheckpointHoldings | None) -> bool:
        nonlocal memory
        decision = next_report(IDENTITY, records, {}, NodeHealth(), memory, now=T0 + at, monotonic=at, heartbeat=5.0,
                               checkpoints=held)
        memory = decision.memory
        if decision.report is not None:
            sent.append(decision)
            memory = memory.after_send(decision.report, at, delivered=True)
        return decision.report is not None

    assert look(0.0, None)
    assert look(0.25, held_copies(1)) and sent[-1].reason == "checkpoint holdings now 1 copies"
    assert not look(0.5, held_copies(1))
    assert look(5.25, held_copies(1))  # the heartbeat carries them again (a lost datagram is made good)
    assert look(5.5, held_copies(40))
    carried = sent[-1].report.checkpoints
    assert [c.step for c in carried.copies] == [100 * i for i in range(40, 8, -1)]  # the newest 32, newest first
    assert carried.copies[0].written_at == round(T0 + 39.0004, 3) and carried.copies[0].save_seconds == 1.235
    assert look(5.75, None) and sent[-1].reason == "checkpoint holdings gone"


class HoldingsReporter:
    """One node's report decisions for the holdings it reads at each moment (a heartbeat of 5 s); `sent` what went."""

    def __init__(self) -> None:
        self.memory, self.sent = ReporterMemory(), []

    def look(self, at: float, held: CheckpointHoldings) -> bool:
        """Whether a report goes at `at` (s) with the node holding `held`."""
        decision = next_report(IDENTITY, [progress(0)], {}, NodeHealth(), self.memory, now=T0 + at, monotonic=at,
                               heartbeat=5.0, checkpoints=held)
        self.memory = decision.memory
        if decision.report is not None:
            self.sent.append(decision)
            self.memory = self.memory.after_send(decision.report, at, delivered=True)
        return decision.report is not None


def test_a_resume_the_node_recorded_goes_to_the_agent_at_once_with_its_read_time():
    node = HoldingsReporter()
    look, sent = node.look, node.sent
    look(0.0, held_copies(2))
    look(0.25, replace(held_copies(2), last_resume=LastResume(200, "buddy", "node3", "node1", 4.2504, T0 + 0.1234)))
    assert len(sent) == 2 and sent[-1].reason == "checkpoint holdings now 2 copies, resumed step 200"
    carried = decode(encode(sent[-1].report, KEY), KEY, "test").checkpoints
    assert carried is not None and carried.last_resume == LastResume(200, "buddy", "node3", "node1", 4.25,
                                                                     round(T0 + 0.1234, 3))


def test_what_the_copy_server_refused_rides_the_next_heartbeat_not_a_report_of_its_own():
    node = HoldingsReporter()
    sent = node.sent

    def look(at: float, refused: dict[str, int]) -> bool:
        return node.look(at, replace(held_copies(2), copies_refused=CopyRefusals.of(T0 - 60.00042, refused)))

    assert look(0.0, {})
    # A stranger floods the copy port: each rewrite of the holdings counts more, none is a report of its own.
    assert not any(look(0.25 * i, {"wrong key": 10 * i, "per peer": 2}) for i in range(1, 20))
    assert look(5.0, {"wrong key": 200, "per peer": 2}) and sent[-1].reason == "heartbeat"
    carried = decode(encode(sent[-1].report, KEY), KEY, "test").checkpoints
    assert carried is not None and carried.copies_refused == CopyRefusals(round(T0 - 60.00042, 3),
                                                                           (("per peer", 2), ("wrong key", 200)))


def test_a_full_node_with_long_evidence_and_32_copies_drops_its_oldest_copies_before_any_rank():
    many = [replace(XID_79, gpu=None, reason="é" * 2000, at_ts=T0 + i) for i in range(40)]
    state = healthd(T0, *many)
    health = node_health(state, T0)
    records = [RankProgress(rank, "node7", 10**12, "checkpoint-save", T0 + 0.123456, 4_000_000 + rank,
                            123456.123456, 10**12, T0 + 0.123456) for rank in range(64)]
    buddy = "buddy-of-node7-" + "x" * 230  # a long name: 32 copies of it and 64 packed ranks overflow a datagram
    held = CheckpointHoldings("node7", tuple(HeldCopy(10**12 - i, buddy, "buddy", 12_345, 12_500, T0, 1.5)
                                             for i in range(32)), T0)
    report = next_report(IDENTITY, records, {}, health, ReporterMemory(), now=T0, monotonic=0, heartbeat=1,
                         checkpoints=held).report
    assert report is not None and len(report.ranks) == 64 and report.checkpoints is not None
    assert 0 < len(report.checkpoints.copies) < 32 and report.checkpoints.copies[0].step == 10**12
    assert decode(encode(report, KEY), KEY, "test") == report


def test_the_holdings_file_is_read_again_only_when_it_changed_and_a_damaged_one_is_said_once(tmp_path):
    path, said = tmp_path / "holdings.json", []
    read = HoldingsReader(path, "node7", said.append)
    assert read() is None and said == []  # no file yet: nothing to tell, nothing wrong
    write_holdings(path, held_copies(2))
    assert read() == held_copies(2)
    stat = path.stat()
    with open(path, "r+b") as f:  # the same size, inode and time, other bytes: not read again
        f.write(b"X")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert read() == held_copies(2)
    path.write_text("{ damaged")
    assert read() is None and read() is None
    path.write_text("{ damaged, again and longer")
    assert read() is None
    assert len(said) == 1 and "cannot read the node's checkpoint holdings" in said[0] and str(path) in said[0]
    write_holdings(path, held_copies(3))
    assert read() == held_copies(3)
    write_holdings(path, held_copies(1, node="node8"))
    assert read() is None and "the holdings of node8, not of this node node7" in said[-1]


def test_the_reporter_carries_the_holdings_of_its_node_in_the_steps_checkpoint_settings_to_the_inbox(tmp_path):
    from clusterctl.records.checkpoint_settings import CheckpointSettings
    tiers = CheckpointSettings(run_key="0123456789abcdef", local_base=str(tmp_path / "shm"), shared_dir="/shared",
                               tier_index="", port=4711)
    write_holdings(tiers.tier_root("node7") / "holdings.json", held_copies(2))
    inbox = ReportInbox(KEY, "127.0.0.1")
    fake = FakeClock()
    sender = ReportSender(KEY, ("127.0.0.1", inbox.port))
    settings = report_settings(settings_env(inbox.port, **tiers.to_env()))
    doors = replace(default_doors(sender, lambda: fake.t >= 1.0, settings), clock=fake.clock())
    try:
        assert run_reporter(settings, tmp_path, 2**22 + 9, doors) == 0
        got = drain_until(inbox, lambda got: len(got) >= 2)
    finally:
        inbox.close()
        sender.close()
    assert got and all(r.checkpoints == reported_holdings(held_copies(2)) for r in got)
    with pytest.raises(ReporterSettingError, match="CLUSTERCTL_CHECKPOINT: .*must be an absolute path"):
        report_settings(settings_env(9, CLUSTERCTL_CHECKPOINT=tiers.to_env()["CLUSTERCTL_CHECKPOINT"].replace(
            str(tmp_path / "shm"), "shm")))


# ---- the ranks' training metrics: one handful of numbers per node ---------------------------------------

def trained(rank: int, pid: int = 0, **metrics: object) -> RankProgress:
    return replace(RankProgress(rank, "node7", 100, "step", T0 + rank / 10, 1000 + rank + pid, 1.0, 100, T0 + 10),
                   **metrics)


def test_a_nodes_ranks_are_summed_and_its_lowest_rank_that_reported_a_loss_speaks_for_it():
    records = [trained(9, tokens=1000.0, flops=6e12, loss=2.5, loss_step=99),
               trained(8, tokens=1000.0, flops=6e12),
               trained(12, tokens=1000.0, flops=6e12, loss=math.nan, loss_step=100, grad_norm=0.7, grad_norm_step=100)]
    told = node_metrics(records, gpu="NVIDIA H100 80GB HBM3")
    assert told is not None
    assert (told.ranks, told.tokens, told.flops, told.at) == (3, 3000.0, 18e12, T0 + 10)
    assert (told.step, told.step_at) == (100, T0 + 0.8)  # the lowest rank's
    assert (told.loss, told.loss_step, told.loss_rank) == (2.5, 99, 9)
    assert (told.grad_norm, told.grad_norm_step, told.grad_norm_rank) == (0.7, 100, 12)
    assert told.gpu == "NVIDIA H100 80GB HBM3"
    restarted = node_metrics([*records[:2], replace(records[2], pid=4242)])
    assert restarted is not None and restarted.epoch != told.epoch  # another process: the agent measures afresh
    assert node_metrics([progress(0), progress(1)]) is None  # a program that reports none of it: nothing sent


def test_the_reporter_sends_what_the_ranks_beat_summed_with_the_nodes_gpu_model(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_NODE_DIR", str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    monkeypatch.setenv("CLUSTERCTL_PROGRESS_LIVENESS", "0")
    # The ranks beat at the reporter's time (its clock below starts at T0), whatever today's date is.
    with time_machine.travel(T0, tick=False):
        for rank in (16, 17):  # two ranks of this node, each its share of the step
            monkeypatch.setenv("RANK", str(rank))
            for step in (1, 2, 3):
                beat(step, tokens=2048, flops=6 * 1e9 * 2048, loss=4.0 - step / 10 - rank / 100, min_interval=0)
    inbox = ReportInbox(KEY, "127.0.0.1")
    fake = FakeClock()
    sender = ReportSender(KEY, ("127.0.0.1", inbox.port))
    settings = report_settings(settings_env(inbox.port))
    doors = replace(default_doors(sender, lambda: fake.t >= 1.0, settings), clock=fake.clock(),
                    gpu_model=lambda: "NVIDIA H100 80GB HBM3")
    try:
        assert run_reporter(settings, tmp_path, 2**22 + 9, doors) == 0
        got = drain_until(inbox, lambda got: len(got) >= 2)
    finally:
        inbox.close()
        sender.close()
    told = got[-1].metrics
    assert told is not None and (told.ranks, told.tokens, told.flops) == (2, 6 * 2048, 6 * 6e9 * 2048)
    assert (told.loss, told.loss_step, told.loss_rank, told.gpu) == (3.54, 3, 16, "NVIDIA H100 80GB HBM3")


def test_the_gpu_model_is_asked_once_aside_and_a_node_without_nvml_names_none():
    def no_driver() -> str:
        raise OSError("NVML Shared Library Not Found")

    model = GpuModel(no_driver)
    model.thread.join(5)
    assert model() == ""
    named = GpuModel(lambda: "NVIDIA B200")
    named.thread.join(5)
    assert named() == "NVIDIA B200"


# ---- the reporter watches its neighbours (launcher/pure/peer_watch.py) ---------------------------------

class FakePeerLink:
    """node7's line to its neighbours node6 and node8: node6 beats until `silent_at`, node8 throughout."""

    def __init__(self, fake: FakeClock, silent_at: float) -> None:
        self.fake, self.silent_at, self.peers = fake, silent_at, ("node6", "node8")
        self.sent: list[tuple[float, PeerBeat]] = []

    def send(self, beat: PeerBeat) -> int:
        self.sent.append((self.fake.t, beat))
        return 2

    def received(self) -> list[PeerBeat]:
        beats = [PeerBeat("4242", "restart-2", "node8", 1)]
        if self.fake.t < self.silent_at:
            beats.append(PeerBeat("4242", "restart-2", "node6", 1))
        return beats + [PeerBeat("4242", "restart-1", "node6", 1)]  # an ended launch's beat counts for nothing


def test_a_neighbour_whose_beats_stop_is_named_to_the_agent_at_once_not_at_the_next_heartbeat(tmp_path):
    write_rank_progress(tmp_path, RankProgress(0, "node7", 41, "step", T0, os.getpid()))
    inbox = ReportInbox(KEY, "127.0.0.1")
    fake = FakeClock()
    sender = ReportSender(KEY, ("127.0.0.1", inbox.port))
    link = FakePeerLink(fake, silent_at=2.0)
    doors = ReporterDoors(fake.clock(), read_node_progress, lambda pid: "gone" if fake.t >= 8 else "running",
                          read_node_health, sender.send, peers=link)  # type: ignore[arg-type]
    settings = report_settings(settings_env(inbox.port, CLUSTERCTL_REPORT_INTERVAL="60"))
    try:
        assert run_reporter(settings, tmp_path, 2**22 + 9, doors) == 0
        got = drain_until(inbox, lambda got: len(got) >= 3)
    finally:
        inbox.close()
        sender.close()
    first, named = got[0], got[1]
    assert first.silent_peers == () and [p.node for p in named.silent_peers] == ["node6"]
    assert 2.5 <= named.silent_peers[0].silent_s < 3.0  # the report went at once: no heartbeat for 60 s
    times = [t for t, beat in link.sent if not beat.leaving]
    assert times[:3] == [0.0, 0.5, 1.0] and all(b.node == "node7" for _, b in link.sent)
    assert link.sent[-1][1].leaving  # its last beat tells the neighbours to stop watching it
