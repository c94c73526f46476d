"""The supervisor's loop against a scripted Slurm: restarts repeat nothing, outages are ridden out."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from clusterctl.errors import RunError
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.launcher.login.shared_reads import SharedReads
from clusterctl.slurm.commands import Completed, Slurm
from clusterctl.slurm.jobs import job_line_argv
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.login.supervisor import EXIT_DONE, EXIT_STOPPED, Hooks, Supervisor, WatchSnapshot
from clusterctl.records.actions import Action
from clusterctl.records.job_health import HealthFinding, JobHealthRecord, job_health_path, write_job_health
from clusterctl.records.run_journal import Submitting
from clusterctl.records.experiment_record import read_experiment_record
from tests.conftest import REPO
from tests.fakes import FakeGit

TOPOLOGY = (REPO / "tests" / "data" / "slurm" / "scontrol-show-topology.txt").read_text()


class ScriptedSlurm:
    """A small Slurm: jobs run until the test ends them; outputs in 22.05's JSON shapes."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, dict] = {}
        self.nodes = {f"node{i}": {"state": "idle", "flags": [], "reason": ""} for i in range(1, 5)}
        self.sbatch_calls: list[list[str]] = []
        self.down_for = 0  # answer this many next calls with "unable to contact"
        self.on_poll = lambda: None
        self.next_id = 1

    def __call__(self, argv, timeout) -> Completed:
        if self.down_for:
            self.down_for -= 1
            return Completed(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
        if argv[:2] == ["sbatch", "--version"]:
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        if argv[:3] == ["scontrol", "show", "topology"]:
            return Completed(0, TOPOLOGY, "")
        if argv[0] == "sbatch":
            self.sbatch_calls.append(list(argv))
            job_id = str(self.next_id)
            self.next_id += 1
            comment = next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))
            excluded = next((a.split("=", 1)[1] for a in argv if a.startswith("--exclude=")), "")
            nodes = [n for n in self.nodes if n not in excluded][:3]
            self.jobs[job_id] = {"job_id": int(job_id), "name": "toy", "job_state": "RUNNING",
                                 "state_reason": "None", "nodes": ",".join(nodes), "exit_code": 0,
                                 "submit_time": self.clock.now, "start_time": self.clock.now, "end_time": 0,
                                 "comment": comment}
            return Completed(0, f"{job_id}\n", "")
        if argv[:2] == ["squeue", "--json"]:
            self.on_poll()
            return Completed(0, json.dumps({"jobs": list(self.jobs.values())}), "")
        if argv[:5] == ["squeue", "-h", "-t", "all", "-j"]:  # the supervisor's one-job poll
            self.on_poll()
            job = self.jobs.get(argv[5])
            if job is None:
                return Completed(1, "", "slurm_load_jobs error: Invalid job id specified")
            when = [time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(job[k])) if job[k] else "N/A"
                    for k in ("submit_time", "start_time", "end_time")]
            return Completed(0, "|".join([argv[5], job["job_state"], str(os.getuid()), *when, job["state_reason"],
                                          job["nodes"], job["comment"]]) + "\n", "")
        if argv[:3] == ["scontrol", "show", "job"]:  # 22.05: the exit code of an ended job
            job = self.jobs[argv[3]]
            status = job["exit_code"]
            return Completed(0, f"JobId={argv[3]} JobName=toy\n   JobState={job['job_state']} Reason=None "
                                f"ExitCode={status >> 8}:{status & 0x7f}\n", "")
        if argv[:3] == ["sinfo", "-h", "-n"]:  # one node as text
            node = self.nodes[argv[3]]
            state = node["state"] + ("*" if "NOT_RESPONDING" in node["flags"] else "")
            if "DRAIN" in node["flags"]:
                state = "drained"
            return Completed(0, f"{argv[3]}|{state}|gpu|{node['reason'] or 'none'}\n", "")
        if argv[:2] == ["sacct", "--json"]:
            return Completed(0, json.dumps({"jobs": []}), "")
        if argv[:2] == ["sinfo", "--json"]:
            return Completed(0, json.dumps({"nodes": [
                {"name": n, "state": s["state"], "state_flags": s["flags"], "reason": s["reason"],
                 "partitions": ["gpu"]} for n, s in self.nodes.items()]}), "")
        if argv[0] == "scancel":
            for job_id in argv[1:]:
                self.jobs[job_id]["job_state"] = "CANCELLED"
            return Completed(0, "", "")
        return Completed(1, "", f"unexpected {argv}")

    def end(self, job_id: str, state: str, exit_status: int = 0) -> None:
        self.jobs[job_id].update(job_state=state, exit_code=exit_status, end_time=self.clock.now)


class Clock:
    def __init__(self) -> None:
        self.now = 1e9

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.01)


@pytest.fixture
def world(tmp_path):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    run = create_run(tmp_path / "run", spec, "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    said: list[str] = []
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append)
    return run, slurm, clock, said, hooks


def _supervisor(run: RunDir, slurm: ScriptedSlurm, hooks: Hooks, records_dir: Path | None = None) -> Supervisor:
    return Supervisor(RunDir(run.path), Slurm(slurm), "/py", records_dir, hooks, evidence_grace=0.0)


def _events(run: RunDir, kind: str) -> list:
    return [e for e in run.events() if e.event == kind]


def test_a_healthd_drain_ends_the_attempt_and_the_next_one_excludes_the_node(world):
    run, slurm, clock, said, hooks = world

    def script() -> None:
        jobs = list(slurm.jobs)
        if jobs == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            slurm.nodes["node2"].update(flags=["DRAIN"], reason="healthd: xid 79 gpu3 (GPU-x) drain-reboot")
        elif jobs == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    assert slurm.jobs["1"]["job_state"] == "CANCELLED"
    assert "--exclude=node2" in slurm.sbatch_calls[1] and "--no-requeue" in slurm.sbatch_calls[1]
    decided = _events(run, "decided")
    assert decided[0].outcome == "node-failure" and decided[0].blame[0].node == "node2"
    assert any("ending job 1 now: node2: healthd: xid 79" in line for line in said)


def test_each_resubmission_records_the_code_it_runs_then(world):
    """The user commits a fix while attempt 1 runs; attempt 2, after node2 fails, runs (and records) the new commit."""
    run, slurm, clock, said, hooks = world
    hooks.git = FakeGit.dirty("a1" * 20)

    def script() -> None:
        jobs = list(slurm.jobs)
        if jobs == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            hooks.git = FakeGit.clean("b2" * 20)
            slurm.nodes["node2"].update(flags=["DRAIN"], reason="healthd: xid 79 gpu3 (GPU-x) drain-reboot")
        elif jobs == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    first, second = (read_experiment_record(run.attempt_dir(n)) for n in (1, 2))
    assert first is not None and second is not None
    assert (first.code.commit, first.code.dirty) == ("a1" * 20, True)
    assert (second.code.commit, second.code.dirty) == ("b2" * 20, False)


def _fail_job_1_after_its_epilog_wrote(slurm: ScriptedSlurm, write_record) -> None:
    def script() -> None:
        jobs = list(slurm.jobs)
        if jobs == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            write_record()
            slurm.end("1", "FAILED", 1 << 8)
        elif jobs == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script


def _xid_record(node: str) -> JobHealthRecord:
    finding = HealthFinding(kind="xid", action=Action.DRAIN_RESET, reason="GPU fell off the bus", source="healthd",
                            xid=79, gpu=3)
    return JobHealthRecord(job_id="1", node=node, window_start="2026-11-22T15:00:00Z",
                           window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z", findings=(finding,))


def test_the_epilogs_record_blames_its_node_with_the_findings_as_evidence(world, tmp_path):
    run, slurm, clock, said, hooks = world
    records = tmp_path / "records"
    _fail_job_1_after_its_epilog_wrote(slurm, lambda: write_job_health(records, _xid_record("node2")))
    assert _supervisor(run, slurm, hooks, records).supervise() == EXIT_DONE
    decided = _events(run, "decided")[0]
    assert decided.outcome == "node-failure" and [b.node for b in decided.blame] == ["node2"]
    assert "epilog record: drain-reset (xid 79 gpu3 drain-reset)" in decided.blame[0].evidence
    assert "--exclude=node2" in slurm.sbatch_calls[1]


def test_an_epilog_record_it_cannot_read_is_skipped_with_a_note(world, tmp_path):
    run, slurm, clock, said, hooks = world
    records = tmp_path / "records"

    def write_newer() -> None:
        path = write_job_health(records, _xid_record("node2"))
        path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    _fail_job_1_after_its_epilog_wrote(slurm, write_newer)
    assert _supervisor(run, slurm, hooks, records).supervise() == EXIT_DONE
    assert _events(run, "decided")[0].outcome == "program-failure"
    notes = [line for line in said if line.startswith("note: skipping an epilog record")]
    assert notes == [f"note: skipping an epilog record: {job_health_path(records, '1', 'node2')}: job-health record "
                     "version 99 is newer than this clusterctl understands (1); upgrade clusterctl on this host"]


def test_a_restarted_supervisor_finds_a_job_submitted_just_before_it_died(world):
    run, slurm, clock, said, hooks = world
    # The journal says "submitting" and Slurm has the job (sbatch got through), but "submitted" was never written.
    run.record(Submitting(at=run.now(), attempt=1, comment=f"clusterctl:{run.path.name}:1:abcd"))
    slurm.jobs["7"] = {"job_id": 7, "name": "toy", "job_state": "COMPLETED", "state_reason": "None",
                       "nodes": "node[1-3]", "exit_code": 0, "submit_time": clock.now, "start_time": clock.now,
                       "end_time": clock.now, "comment": f"clusterctl:{run.path.name}:1:abcd"}
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    assert slurm.sbatch_calls == [] and _events(run, "submitted")[0].job_id == "7"


def test_a_restart_after_a_decision_repeats_nothing(world):
    run, slurm, clock, said, hooks = world
    slurm.on_poll = lambda: "1" in slurm.jobs and slurm.end("1", "COMPLETED")
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    events = len(run.events())
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    assert len(slurm.sbatch_calls) == 1 and len(run.events()) == events


def test_an_unreachable_controller_is_waited_out(world):
    run, slurm, clock, said, hooks = world
    polls = {"n": 0}

    def script() -> None:
        polls["n"] += 1
        if polls["n"] == 2:
            slurm.down_for = 4
        if polls["n"] == 4:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    assert sum("Slurm did not answer" in line for line in said) == 4 and len(slurm.sbatch_calls) == 1


def test_a_job_id_reused_by_a_fresh_cluster_is_not_mistaken_for_ours(world):
    run, slurm, clock, said, hooks = world

    def script() -> None:
        # The controller now shows job 1 as an old, completed job submitted long before ours.
        if "1" in slurm.jobs:
            slurm.jobs["1"].update(submit_time=clock.now - 86400, job_state="COMPLETED", comment="")
    slurm.on_poll = script

    class Enough(Exception):
        pass

    def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > limit:
            raise Enough
    limit = clock.now + 3
    hooks.sleep = sleep
    with pytest.raises(Enough):  # still watching for its own job 1: never "completed" on the old one
        _supervisor(run, slurm, hooks).supervise()
    assert _events(run, "decided") == [] and len(slurm.sbatch_calls) == 1


def test_too_few_nodes_waits_or_stops_as_the_policy_says(world, tmp_path):
    run, slurm, clock, said, hooks = world
    for name in ("node1", "node2"):
        slurm.nodes[name].update(state="down", flags=["NOT_RESPONDING"])
    text = (REPO / "examples" / "toy_trainer.toml").read_text()
    spec_path = tmp_path / "stop.toml"
    spec_path.write_text(text.replace("workdir = \".\"", f"workdir = \"{REPO / 'examples'}\"")
                         .replace("max_program_failures = 1", "max_program_failures = 1\non_too_few_nodes = \"stop\""))
    stop_run = create_run(tmp_path / "stop-run", load_spec(spec_path), "")
    assert _supervisor(stop_run, slurm, hooks).supervise() == EXIT_STOPPED
    message = _events(stop_run, "stopped")[0].message
    assert re.match(r"only 2 usable nodes \(node\[3-4\]\) for 3; excluded: none; restart.on_too_few_nodes = stop",
                    message) and slurm.sbatch_calls == []


def test_one_supervisor_per_run(world):
    run, slurm, clock, said, hooks = world
    held = RunDir(run.path).lock()
    with pytest.raises(RunError, match="is already supervised by pid"):
        _supervisor(run, slurm, hooks).supervise()
    os.close(held)


def test_supervisors_of_one_runs_directory_share_one_squeue_per_interval(tmp_path):
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    calls = {"squeue": 0}
    slurm.on_poll = lambda: calls.__setitem__("squeue", calls["squeue"] + 1)
    readers = [SharedReads(Slurm(slurm), tmp_path, 2.0, clock.time) for _ in range(10)]
    for reader in readers:
        assert reader.queue() == {}
    assert calls["squeue"] == 1
    clock.sleep(2.0)
    assert readers[3].queue() == {} and readers[7].queue() == {} and calls["squeue"] == 2


def test_a_shared_answer_it_cannot_read_is_asked_of_slurm_again(tmp_path):
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    calls = {"squeue": 0}
    slurm.on_poll = lambda: calls.__setitem__("squeue", calls["squeue"] + 1)
    (tmp_path / f".clusterctl-{os.getuid()}").mkdir(mode=0o700)
    (tmp_path / f".clusterctl-{os.getuid()}" / ".slurm-squeue.json").write_text('{"kind": "slurm-cache", "version": 9}')
    assert SharedReads(Slurm(slurm), tmp_path, 2.0, clock.time).queue() == {} and calls["squeue"] == 1
    assert SharedReads(Slurm(slurm), tmp_path, 2.0, clock.time).queue() == {} and calls["squeue"] == 1


def test_a_supervised_run_polls_its_own_job_and_nodes_never_the_whole_queue_or_table(world):
    run, slurm, clock, said, hooks = world
    asked: list[list[str]] = []
    answer = slurm.__call__
    slurm_calls = {"polls": 0}

    def script() -> None:
        slurm_calls["polls"] += 1
        if slurm_calls["polls"] == 12:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script
    sleeps: list[float] = []
    hooks.sleep = lambda s: (sleeps.append(s), clock.sleep(s))

    def recording(argv, timeout):
        asked.append(list(argv))
        return answer(argv, timeout)
    supervisor = _supervisor(run, recording, hooks)
    assert supervisor.supervise() == EXIT_DONE
    submitted = next(i for i, a in enumerate(asked) if a[0] == "sbatch" and a[1] != "--version")
    after = asked[submitted + 1:]
    polls = [a for a in after if a[:2] == ["squeue", "-h"]]
    exits = [a for a in after if a[:3] == ["scontrol", "show", "job"]]
    one_node = [a for a in after if a[0] == "sinfo" and "-n" in a or a[:3] == ["scontrol", "show", "node"] and len(a) > 3]
    assert len(polls) + len(exits) + len(one_node) == len(after), after  # never the whole queue or node table
    assert len(polls) == 11 and len(exits) == 1
    assert sleeps[:5] == [2.0, 4.0, 8.0, 8.0, 8.0]  # a job running steadily is looked at less often
    assert job_line_argv("1") in asked


def test_the_live_line_sees_each_attempt_its_job_and_the_nodes_still_blamed(world):
    run, slurm, clock, said, hooks = world
    shown: list[WatchSnapshot] = []
    hooks.show = shown.append

    def script() -> None:
        jobs = list(slurm.jobs)
        if jobs == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            slurm.nodes["node2"].update(flags=["DRAIN"], reason="healthd: xid 79 gpu3 (GPU-x) drain-reboot")
        elif jobs == ["1", "2"] and len([s for s in shown if s.job_id == "2"]) >= 2:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE

    first, last = shown[0], [s for s in shown if s.job_id == "2"][-1]
    assert (first.attempt, first.job_id, first.state, first.blamed) == (1, "1", "RUNNING", ())
    assert (last.attempt, last.state, last.nodes) == (2, "RUNNING", "node1,node3,node4")
    assert [node for node, _ in last.blamed] == ["node2"] and "xid 79" in last.blamed[0][1]


def test_a_node_reason_that_looks_like_markup_is_said_as_written_and_the_job_still_ends(world):
    """An admin's (or slurmd's, or a checker's) reason `GPU gone [/dev/nvidia3]` once killed the supervisor
    between journaling "ending" and cancelling the job: its terminal read the reason as rich markup."""
    from io import StringIO

    from rich.console import Console

    from clusterctl.launcher.login.text_view import saying

    run, slurm, clock, said, hooks = world
    out = StringIO()
    # A console as rich makes it by default (markup on): the line must not depend on the console's settings.
    hooks.say = saying(Console(file=out, width=500, color_system=None), lambda: "12:00:00")

    def script() -> None:
        jobs = list(slurm.jobs)
        if jobs == ["1"] and slurm.jobs["1"]["job_state"] == "RUNNING":
            slurm.nodes["node2"].update(state="down", reason="GPU gone [/dev/nvidia3] [maint]")
        elif jobs == ["1", "2"]:
            slurm.end("2", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    assert slurm.jobs["1"]["job_state"] == "CANCELLED"
    assert "node2: node down (GPU gone [/dev/nvidia3] [maint])" in out.getvalue()


def test_a_run_waiting_for_nodes_reads_the_node_table_less_and_less_often(world):
    """Waiting an hour for usable nodes costs about 15 node-table reads, not one every 8 s (450)."""
    run, slurm, clock, said, hooks = world
    for name in ("node1", "node2"):
        slurm.nodes[name].update(state="down", flags=["NOT_RESPONDING"])
    table_reads = []

    def recording(argv, timeout):
        if argv[:2] == ["sinfo", "--json"]:
            table_reads.append(clock.now)
        return slurm(argv, timeout)

    class Enough(Exception):
        pass

    def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > started + 3600:
            raise Enough
    started = clock.now
    hooks.sleep = sleep
    with pytest.raises(Enough):
        Supervisor(RunDir(run.path), Slurm(recording), "/py", None, hooks, evidence_grace=0.0).supervise()
    assert 5 <= len(table_reads) <= 20, table_reads
    assert max(b - a for a, b in zip(table_reads, table_reads[1:])) == 300
    assert len(_events(run, "waiting")) == 1 and slurm.sbatch_calls == []
    # Nodes come back: the next read (within the 5-minute cap) submits.
    slurm.nodes["node1"].update(state="idle", flags=[])
    clock.now = started
    table_reads.clear()
    hooks.sleep = clock.sleep
    slurm.on_poll = lambda: slurm.end("1", "COMPLETED") if "1" in slurm.jobs else None
    Supervisor(RunDir(run.path), Slurm(recording), "/py", None, hooks, evidence_grace=0.0).supervise()
    assert len(slurm.sbatch_calls) == 1


def _agent_job(tmp_path, summary_until_poll: int, ends_at_poll: int) -> list[int]:
    """A job with a spare whose agent writes its summary at every poll up to `summary_until_poll`;
    the polls at which the supervisor read a node from Slurm while the job ran."""
    from dataclasses import replace

    from clusterctl.records.agent_summary import AgentSummary, write_agent_summary
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    spec = replace(spec, job=replace(spec.job, spare_nodes=1))
    run = create_run(tmp_path / "run", spec, "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=lambda line: None)
    polls = {"n": 0}
    read_at: list[int] = []

    def script() -> None:
        polls["n"] += 1
        if polls["n"] <= summary_until_poll:
            write_agent_summary(run.path / "jobs" / "1", AgentSummary("1", "0", clock.now, 2.0, "watching", 3, 3))
        if polls["n"] == ends_at_poll:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script

    def recording(argv, timeout):
        if argv[0] == "sinfo" or argv[:3] == ["scontrol", "show", "node"]:
            read_at.append(polls["n"])
        return slurm(argv, timeout)
    assert _supervisor(run, recording, hooks).supervise() == EXIT_DONE
    return [n for n in read_at if 0 < n < ends_at_poll]


def test_while_the_jobs_agent_writes_its_summary_the_supervisor_asks_slurm_about_no_node(tmp_path):
    assert _agent_job(tmp_path, summary_until_poll=100, ends_at_poll=12) == []


def test_once_the_agents_summary_goes_stale_the_supervisor_reads_the_nodes_itself(tmp_path):
    read_at = _agent_job(tmp_path, summary_until_poll=4, ends_at_poll=20)
    # Stale after 3 intervals and 30 s (36 s here, polls 8 s apart): from the ninth poll or so.
    assert read_at and min(read_at) > 4


def test_a_straggler_the_jobs_agent_journals_is_said_once_in_the_supervisors_output(world):
    from clusterctl.records.run_journal import StragglerFound, append_run_event
    run, slurm, clock, said, hooks = world
    polls = {"n": 0}

    def script() -> None:
        polls["n"] += 1
        if polls["n"] == 3:
            append_run_event(run.path / "journal.jsonl", StragglerFound(
                at=clock.now, job_id="1", node="node2", ranks=(11,), ratio=2.5, seconds=0.5, reference=0.2,
                steps=30, since_step=20, lost_s=9.0, evidence=("rank 11 ...",), hardware=("GPU 3: thermal",),
                action="excluded"))
        if polls["n"] == 8:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script
    assert _supervisor(run, slurm, hooks).supervise() == EXIT_DONE
    lines = [line for line in said if "straggler node2" in line]
    assert len(lines) == 1 and "2.50x" in lines[0] and "GPU 3: thermal" in lines[0] and "excluded" in lines[0]


def _batch_host_dies(tmp_path, standby_takes_over: bool, silent_polls: int = 0
                     ) -> tuple[int, list[str], list, ScriptedSlurm]:
    """A job with a spare on node1-3 whose batch host node1 leaves the job at the fourth poll (after
    `silent_polls` polls of Slurm saying it does not respond, its agent's summary stale); with
    `standby_takes_over` its standby on node3 takes the next epoch and, five polls later, journals
    that the run completed and cancels the job (as a standby that took over does)."""
    from dataclasses import replace

    from clusterctl.records.agent_lease import AgentLease, register_standby, take_lease
    from clusterctl.records.agent_summary import AgentSummary, write_agent_summary
    from clusterctl.records.rank_map import JobRankMap, RankMap, write_rank_map
    from clusterctl.records.run_journal import AgentEnded, OutcomeKind, append_run_event
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    spec = replace(spec, job=replace(spec.job, spare_nodes=1))
    run = create_run(tmp_path / "run", spec, "")
    clock = Clock()
    slurm = ScriptedSlurm(clock)
    said: list[str] = []
    hooks = Hooks(clock=clock.time, sleep=clock.sleep, say=said.append)
    polls = {"n": 0}
    job_dir = run.path / "jobs" / "1"

    def script() -> None:
        polls["n"] += 1
        if "2" in slurm.jobs:  # the resubmission completes
            slurm.end("2", "COMPLETED")
        if "1" not in slurm.jobs or slurm.jobs["1"]["job_state"] != "RUNNING":
            return
        if not (job_dir / "rankmap.json").exists():
            write_rank_map(job_dir, JobRankMap("1", "node[1-3]", RankMap(("node1", "node2"), 8), 20001))
            take_lease(job_dir, AgentLease(1, "node1", 10, clock.now))
            register_standby(job_dir, AgentLease(2, "node3", 11, clock.now, role="standby"))
        if polls["n"] < 4:
            write_agent_summary(job_dir, AgentSummary("1", "0", clock.now, 2.0, "watching", 2, 2))
        if polls["n"] == 4:
            slurm.nodes["node1"].update(flags=["NOT_RESPONDING"])
        if polls["n"] == 4 + silent_polls:
            slurm.nodes["node1"].update(state="down")
            slurm.jobs["1"]["nodes"] = "node2,node3"
        if standby_takes_over and polls["n"] == 5 + silent_polls:
            take_lease(job_dir, AgentLease(2, "node3", 11, clock.now, why="node1 left the job"))
        if standby_takes_over and polls["n"] == 9 + silent_polls:
            append_run_event(run.path / "journal.jsonl", AgentEnded(
                at=clock.now, job_id="1", agent="node3", epoch=2, exit_code=0, outcome=OutcomeKind.COMPLETED,
                message="the step completed"))
            slurm.end("1", "CANCELLED")
        if polls["n"] > 200:
            slurm.end("1", "COMPLETED")
    slurm.on_poll = script
    code = _supervisor(run, slurm, hooks).supervise()
    return code, said, list(run.events()), slurm


def test_a_batch_host_slurm_says_is_not_responding_is_left_to_the_standby_not_ended_and_resubmitted(tmp_path):
    """Under Slurm's default timeouts a dead batch host is only NOT_RESPONDING for minutes before Slurm
    takes it out of the job: the supervisor waits for the standby's takeover instead of sending the job
    back to the queue (the two deciding differently resubmitted it, measured on the testbed)."""
    code, said, events, slurm = _batch_host_dies(tmp_path, standby_takes_over=True, silent_polls=60)
    assert code == EXIT_DONE, said
    assert len(slurm.sbatch_calls) == 1 and not [e for e in events if e.event == "ending"], said


def test_a_job_whose_standby_took_over_from_its_dead_batch_host_is_left_to_it_and_ends_done(tmp_path):
    code, said, events, slurm = _batch_host_dies(tmp_path, standby_takes_over=True)
    assert code == EXIT_DONE
    assert len(slurm.sbatch_calls) == 1 and not [e for e in events if e.event == "ending"]
    assert any("took it over from its dead batch host" in line for line in said)


def test_a_job_whose_standby_never_takes_over_is_ended_and_resubmitted_without_the_batch_host(tmp_path):
    code, said, events, slurm = _batch_host_dies(tmp_path, standby_takes_over=False)
    (ending,) = [e for e in events if e.event == "ending"][:1]
    assert [b.node for b in ending.blame] == ["node1"]
    assert len(slurm.sbatch_calls) >= 2 and "--exclude=node1" in slurm.sbatch_calls[1]
