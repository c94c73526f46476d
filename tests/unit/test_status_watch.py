"""`clusterctl status RUN --watch`: the loop with a fake clock and fake reads, then over a real run directory."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.status import CheckpointStatus, RunStatus
from clusterctl.launcher.login.watch import SLURM_EVERY_S, RunFiles, skip_history, watch_run
from clusterctl.launcher.login.watch_view import LineView
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics, write_agent_summary
from clusterctl.records.run_journal import (
    EventKind, RunEnded, RunEvent, StragglerFound, Submitted, append_run_event, event_to_json,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.jobs import JobReport
from tests.conftest import REPO

RUN = Path("/runs/toy")
RUNNING = RunStatus(run=RUN, name="toy", state="RUNNING", message="", attempts=(), in_allocation=(),
                    stragglers=(), step_times=None)
DONE = RunStatus(run=RUN, name="toy", state="done", message="completed", attempts=(), in_allocation=(),
                 stragglers=(), step_times=None)
STOPPED = RunStatus(run=RUN, name="toy", state="stopped", message="out of restarts", attempts=(),
                    in_allocation=(), stragglers=(), step_times=None)
PROGRESSING = replace(
    RUNNING, total_steps=60, looked_at=1_800_000_000.0,
    agent=AgentSummary("7", "0", 1_800_000_000.0, 2.0, "watching", 2, 2, min_step=20, max_step=20,
                       training=TrainingMetrics(window_s=30.0, nodes=2, nodes_reporting=2, gpus=16, steps_per_s=2.0)),
    checkpoint=CheckpointStatus("/runs/toy/checkpoints", "manifest", 1, 10, "/runs/toy/checkpoints/step-00000010",
                                1_800_000_000.0 - 30.0))
STRAGGLER = StragglerFound(at=5.0, job_id="7", node="node3", ranks=(4, 5), ratio=1.4, seconds=1.4, reference=1.0,
                           steps=30, since_step=100, lost_s=12.0, evidence=())


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class ScriptedReads:
    """Each look takes the next (events, status) of the script; a status that is an exception is raised."""

    def __init__(self, looks: list[tuple[list[RunEvent], RunStatus | None | Exception]]) -> None:
        self.looks = looks
        self.pending: RunStatus | None | Exception = None
        self.asked_slurm = 0

    def new_events(self) -> list[RunEvent]:
        events, self.pending = self.looks.pop(0)
        return events

    def status(self, ask_slurm: bool) -> RunStatus | None:
        self.asked_slurm += ask_slurm
        if isinstance(self.pending, Exception):
            raise self.pending
        return self.pending


def watched(looks: list[tuple[list[RunEvent], RunStatus | None | Exception]]) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = watch_run(ScriptedReads(looks), LineView(lines.append), FakeClock(), 2.0)
    return code, lines


def test_a_fault_in_the_journal_becomes_a_line_with_its_time():
    code, lines = watched([([], RUNNING), ([STRAGGLER], None), ([], DONE)])
    assert code == 0
    assert lines[1] == ("2027-01-15T08:00:02Z job 7: straggler node3: 1.40x the job's compute time, 12.0 s lost; "
                        "reported")


def test_nothing_changed_prints_nothing_new():
    code, lines = watched([([], RUNNING), ([], None), ([], RUNNING), ([], None), ([], DONE)])
    assert code == 0
    assert [line.split(" ", 1)[1].split(";")[0] for line in lines] == ["toy RUNNING", "toy done"]


def test_the_watch_ends_with_the_run_and_says_how_it_ended():
    code, lines = watched([([], RUNNING), ([RunEnded(kind=EventKind.STOPPED, at=9.0, message="out of restarts")], STOPPED)])
    assert code == 1
    assert "run stopped: out of restarts" in lines[-2]


def test_a_record_that_cannot_be_read_is_one_line_and_the_watch_goes_on():
    code, lines = watched([([], RecordError("/runs/toy/jobs/7/agent-summary.json", "not JSON")), ([], DONE)])
    assert code == 0
    assert lines[0].endswith("cannot read the run's records: /runs/toy/jobs/7/agent-summary.json: not JSON; "
                             "still watching")


def test_json_lines_are_status_json_with_the_time():
    lines: list[str] = []
    watch_run(ScriptedReads([([], RUNNING), ([], DONE)]), LineView(lines.append, as_json=True), FakeClock(), 2.0)
    first = json.loads(lines[0])
    assert first == {"at": 1_800_000_000.0, **RUNNING.to_json()}


def test_every_line_carries_an_honest_eta():
    _, lines = watched([([], RUNNING), ([], DONE)])
    assert lines[0].endswith("toy RUNNING; ETA unknown: set [job] total_steps in the spec")
    assert lines[1].endswith("toy done; ETA: done")


def test_a_checkpoint_growing_older_is_not_a_new_line_but_each_line_says_its_age():
    saved = CheckpointStatus("/runs/toy/checkpoints", "manifest", 1, 40, "/runs/toy/checkpoints/step-00000040",
                             1_800_000_000.0 - 90.0)
    running = replace(RUNNING, checkpoint=saved)
    code, lines = watched([([], running), ([], running), ([], replace(running, state="COMPLETING")), ([], DONE)])
    assert code == 0
    assert [line.split("; ")[:2] for line in lines[:2]] == [
        ["2027-01-15T08:00:00Z toy RUNNING", "checkpoint step 40 saved 90.0 s ago"],
        ["2027-01-15T08:00:04Z toy COMPLETING", "checkpoint step 40 saved 94.0 s ago"]]


# ---- over a run directory -----------------------------------------------------------------------------


T0 = 1_800_000_000.0
"""The fake clock's start: the run's job was submitted then, and Slurm started it 10 s later."""


class CountingSlurm:
    def __init__(self, nodes: str = "node[1-2]") -> None:
        self.calls = 0
        self.state = "RUNNING"
        self.nodes = nodes

    def queue(self, job_ids=()):
        self.calls += 1
        return {j: JobReport(job_id=j, name="toy", state=self.state, reason="None", nodes=self.nodes, exit_code=None,
                             signal=None, submit_time=T0, start_time=T0 + 10.0, end_time=0.0) for j in job_ids}

    def accounting(self, job_ids):
        self.calls += 1
        return {}


def example_without_total_steps() -> str:
    """The example trainer's spec without its total step count (each story sets its own, or none)."""
    text = (REPO / "examples" / "toy_trainer.toml").read_text()
    return re.sub(r"^total_steps = .*\n", "", text, flags=re.M).replace('"{total_steps}"', '"60"')

def a_run(tmp_path: Path, spec_lines: str = "total_steps = 60", tiers: bool = False) -> RunDir:
    """The example trainer's run (its checkpoints in {run_dir}/checkpoints), its job 7 submitted at T0."""
    text = example_without_total_steps().replace('time = "10:00"\n',
                                                                       f'time = "10:00"\n{spec_lines}\n')
    text = text.replace('name = "toy-trainer"', 'name = "toy"')
    if tiers:
        text = text.replace('validator = "manifest"\n', "tiers = true\n")
    run = create_run(tmp_path / "toy", parse_spec(text, "toy.toml", base_dir=REPO / "examples"), text)
    run.job_dir("7").mkdir(parents=True)
    append_run_event(run.journal_path, Submitted(at=T0, attempt=1, job_id="7"))
    return run


def save_checkpoint(run: RunDir, step: int, written_at: float) -> None:
    """A checkpoint as the example trainer writes it: a temporary folder, manifest.json last, renamed into place."""
    checkpoints = run.path / "checkpoints"
    temporary = checkpoints / f".tmp-{step}"
    temporary.mkdir(parents=True)
    payload = json.dumps({"step": step}).encode()
    (temporary / "params.json").write_bytes(payload)
    (temporary / "manifest.json").write_text(json.dumps({
        "step": step, "params_sha256": hashlib.sha256(payload).hexdigest(), "written_at": written_at,
        "save_seconds": 0.5}))
    temporary.rename(checkpoints / f"step-{step:08d}")


def training(run: RunDir, step: int, steps_per_s: float, at: float) -> None:
    """The job's agent's summary: every node at `step`, the job making `steps_per_s`."""
    metrics = TrainingMetrics(window_s=30.0, nodes=2, nodes_reporting=2, gpus=16, steps_per_s=steps_per_s)
    write_agent_summary(run.job_dir("7"), AgentSummary("7", "0", at, 2.0, "watching", 2, 2, min_step=step,
                                                       max_step=step, training=metrics))


class RunClock(FakeClock):
    """Does what `script` says at its times (seconds after T0) as the watch goes: by default a straggler at
    10 s and the run's end at 70 s."""

    def __init__(self, run: RunDir, script: Sequence[tuple[float, Callable[[], object]]] = ()) -> None:
        super().__init__()
        self.start, self.run = self.t, run
        self.script = list(script) or [
            (10.0, lambda: append_run_event(run.journal_path, STRAGGLER)),
            (70.0, lambda: append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE, at=T0 + 70.0)))]

    def sleep(self, seconds: float) -> None:
        before = self.t - self.start
        super().sleep(seconds)
        for when, action in self.script:
            if before < when <= self.t - self.start:
                action()


def test_over_a_run_directory_slurm_is_asked_at_most_once_per_30_seconds(tmp_path):
    run = a_run(tmp_path)
    slurm, lines, notes, clock = CountingSlurm(), [], [], RunClock(run)
    reads = RunFiles(run, slurm, notes.append, now=clock.now)
    skip_history(reads)
    code = watch_run(reads, LineView(lines.append), clock, 2.0)
    assert code == 0
    assert slurm.calls <= 70.0 / SLURM_EVERY_S + 1
    shown = [line.split(" ", 1)[1] for line in lines]
    assert shown[0].startswith("toy RUNNING; attempt 1 (job 7)")
    assert any(line.startswith("job 7: straggler node3") for line in shown)
    assert shown[-2:] == ["run done", "toy done; attempt 1 (job 7); no complete checkpoint yet; goodput 86%; "
                                      "ETA: done"]


def test_a_running_job_shows_its_eta_its_newest_checkpoint_with_its_age_and_the_goodput_so_far(tmp_path):
    """Job 7 started 10 s after its submission; at 40 s its ranks are at step 20 of 60, making 2 steps/s,
    and checkpoint 10 was saved at 30 s."""
    run = a_run(tmp_path)
    lines: list[str] = []
    clock = RunClock(run, [(30.0, lambda: save_checkpoint(run, 10, T0 + 30.0)),
                           (40.0, lambda: training(run, 20, 2.0, T0 + 40.0)),
                           (44.0, lambda: append_run_event(run.journal_path, RunEnded(kind=EventKind.STOPPED,
                                                                                      at=T0 + 44.0)))])
    reads = RunFiles(run, CountingSlurm(), [].append, now=clock.now)
    skip_history(reads)
    assert watch_run(reads, LineView(lines.append), clock, 2.0) == 1
    at_40 = next(line for line in lines if "step 20" in line)
    assert at_40.startswith("2027-01-15T08:00:40Z toy RUNNING; attempt 1 (job 7); job 7 training (last 30 s): "
                            "step 20, 2 steps/s")
    assert at_40.endswith("; checkpoint step 10 saved 10.0 s ago; goodput so far 75%; "
                          "ETA 20.0 s: 40 steps left at 2 steps/s (26.7 s at the run's goodput so far, 75%)")


def test_watch_json_lines_carry_the_eta_the_checkpoint_and_the_goodput(tmp_path):
    run = a_run(tmp_path)
    save_checkpoint(run, 10, T0 + 30.0)
    training(run, 20, 2.0, T0 + 40.0)
    lines: list[str] = []
    clock = RunClock(run, [(1.0, lambda: append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE,
                                                                                    at=T0 + 41.0)))])
    clock.t = clock.start = T0 + 40.0
    reads = RunFiles(run, CountingSlurm(), [].append, now=clock.now)
    skip_history(reads)
    watch_run(reads, LineView(lines.append, as_json=True), clock, 2.0)
    shown = json.loads(lines[0])
    assert shown["eta"] == {"state": "estimate", "total_steps": 60, "step": 20, "steps_left": 40, "steps_per_s": 2.0,
                            "seconds": 20.0, "goodput": 0.75, "seconds_at_goodput": 20.0 / 0.75, "why": ""}
    assert (shown["checkpoint"]["step"], shown["checkpoint"]["written_at"]) == (10, T0 + 30.0)
    assert shown["goodput"]["goodput"] == 0.75 and shown["goodput"]["queue_seconds"] == 10.0


def test_the_checkpoint_directory_is_read_again_only_when_a_stat_shows_a_change(tmp_path):
    """Checkpoint 10 is shown; then its manifest is rewritten to say step 11 with its size and times kept (no
    stat sees it): the watch goes on showing step 10 while the job trains on, so it did not read the directory
    again.  Checkpoint 20, renamed into place, is seen at the next look."""
    run = a_run(tmp_path)
    save_checkpoint(run, 10, T0)
    manifest = run.path / "checkpoints" / "step-00000010" / "manifest.json"

    def disguise() -> None:
        before = os.stat(manifest)
        manifest.write_text(manifest.read_text().replace('"step": 10', '"step": 11'))
        os.utime(manifest, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.utime(manifest.parent, ns=(before.st_atime_ns, os.stat(manifest.parent).st_mtime_ns))

    lines: list[str] = []
    clock = RunClock(run, [(3.0, disguise), (4.0, lambda: training(run, 12, 1.0, T0 + 4.0)),
                           (8.0, lambda: training(run, 16, 1.0, T0 + 8.0)),
                           (12.0, lambda: save_checkpoint(run, 20, T0 + 12.0)),
                           (14.0, lambda: append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE,
                                                                                      at=T0 + 14.0)))])
    reads = RunFiles(run, CountingSlurm(), [].append, now=clock.now)
    skip_history(reads)
    watch_run(reads, LineView(lines.append), clock, 2.0)
    said = [(line[:20], step) for line in lines for step in ("checkpoint step 10 ", "checkpoint step 11 ",
                                                            "checkpoint step 20 ") if step in line]
    assert said == [("2027-01-15T08:00:00Z", "checkpoint step 10 "), ("2027-01-15T08:00:04Z", "checkpoint step 10 "),
                    ("2027-01-15T08:00:08Z", "checkpoint step 10 "), ("2027-01-15T08:00:12Z", "checkpoint step 20 "),
                    ("2027-01-15T08:00:14Z", "checkpoint step 20 ")]


def test_a_garbled_agent_summary_is_a_clear_note_not_a_traceback(tmp_path):
    run = a_run(tmp_path)
    (run.path / "jobs" / "7" / "agent-summary.json").write_text("{not json")
    append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE, at=3.0))
    notes: list[str] = []
    code = watch_run(RunFiles(run, CountingSlurm(), notes.append), LineView([].append), FakeClock(), 2.0)
    assert code == 0
    assert len(notes) == 1 and "agent-summary.json" in notes[0]


def test_a_line_still_being_written_is_read_when_it_is_whole(tmp_path):
    run = a_run(tmp_path)
    reads = RunFiles(run, CountingSlurm(), [].append)
    skip_history(reads)
    line = json.dumps(event_to_json(RunEnded(kind=EventKind.DONE, at=3.0))) + "\n"
    with run.journal_path.open("a") as journal:
        journal.write(line[:10])
    assert list(reads.new_events()) == []
    with run.journal_path.open("a") as journal:
        journal.write(line[10:])
    assert [e.event for e in reads.new_events()] == [EventKind.DONE]


def test_a_checkpoint_written_in_place_is_seen_when_its_marker_lands(tmp_path):
    """PyTorch DCP writes into the checkpoint's own folder and its .metadata last: the folder of step 20 is made
    before the watch's first look and the marker lands in it later, which changes no stat of the checkpoint
    directory itself; the watch sees it at the next look all the same (it stats the folders newer than the
    newest complete checkpoint)."""
    run = a_run(tmp_path, 'total_steps = 60')
    spec = (run.path / "spec.json").read_text().replace('"validator": "manifest"', '"validator": "dcp"')
    (run.path / "spec.json").write_text(spec)
    checkpoints = run.path / "checkpoints"
    for step in (10, 20):
        (checkpoints / f"step-{step}").mkdir(parents=True)
        (checkpoints / f"step-{step}" / "__0_0.distcp").write_bytes(b"shard")
    (checkpoints / "step-10" / ".metadata").write_bytes(b"metadata")
    lines: list[str] = []
    clock = RunClock(run, [(4.0, lambda: (checkpoints / "step-20" / ".metadata").write_bytes(b"metadata")),
                           (6.0, lambda: append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE,
                                                                                     at=T0 + 6.0)))])
    reads = RunFiles(run, CountingSlurm(), [].append, now=clock.now)
    skip_history(reads)
    watch_run(reads, LineView(lines.append), clock, 2.0)
    assert [line.split("; ")[2].split(" saved")[0] for line in lines if "RUNNING" in line] == [
        "checkpoint step 10", "checkpoint step 20"]
    assert lines[-1].split(" ", 1)[1].startswith("toy done; attempt 1 (job 7); checkpoint step 20")


LIVE_ON_A_PTY = """
from rich.live import Live
from clusterctl.terminal_view import terminal
from clusterctl.launcher.login.watch import watch_run
from clusterctl.launcher.login.watch_view import LiveView
from tests.unit.test_status_watch import DONE, PROGRESSING, STRAGGLER, FakeClock, ScriptedReads
console = terminal()
with Live(console=console, auto_refresh=False) as live:
    code = watch_run(ScriptedReads([([], PROGRESSING), ([STRAGGLER], None), ([], DONE)]),
                     LiveView(lambda shown: live.update(shown, refresh=True)), FakeClock(), 2.0)
print("watch ended", code, console.is_terminal)
"""


def test_on_a_narrow_pseudo_terminal_the_live_view_shows_the_fault_and_ends(tmp_path):
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "40", "LINES": "40", "TERM": "xterm", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", LIVE_ON_A_PTY], stdin=follower, stdout=follower,
                             stderr=follower, env=env, cwd=REPO)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert child.wait(timeout=30) == 0
    text = out.decode("utf-8", "replace").replace("\r", "")
    assert "straggler" in text and "node3: 1.40x the job's compute time," in text  # wrapped at 40 columns
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # without the terminal's styles
    assert "\nETA 20.0 s: 40 steps left at 2 steps/s\n" in shown
    assert "\nnewest complete checkpoint: step 10 \n(saved 2027-01-15T07:59:30Z, 30.0 s \nago)" in shown
    assert "watch ended 0 True" in text
    assert "\x1b[?25h" in text  # the cursor shown again: the terminal restored


def test_watch_asks_for_one_run_and_a_sane_interval():
    no_run = CliRunner().invoke(cli, ["status", "--watch"])
    assert no_run.exit_code == 2 and "--watch needs one RUN or JOB" in no_run.output
    too_fast = CliRunner().invoke(cli, ["status", "/runs/toy", "--watch", "--interval", "0.1"])
    assert too_fast.exit_code == 2 and "0.1 is not in the range 0.5<=x<=60.0" in too_fast.output
