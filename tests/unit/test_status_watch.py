"""`clusterctl status RUN --watch`: the loop with a fake clock and fake reads, then over a real run directory."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.status import RunStatus
from clusterctl.launcher.login.watch import SLURM_EVERY_S, RunFiles, skip_history, watch_run
from clusterctl.launcher.login.watch_view import LineView
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.records.run_journal import (
    Created, EventKind, RunEnded, RunEvent, StragglerFound, Submitted, append_run_event, event_to_json,
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
    _, lines = watched([([], DONE)])
    assert "ETA unknown: neither the spec nor the program names a total step count" in lines[0]


# ---- over a run directory -----------------------------------------------------------------------------


class CountingSlurm:
    def __init__(self) -> None:
        self.calls = 0
        self.state = "RUNNING"

    def queue(self, job_ids=()):
        self.calls += 1
        return {j: JobReport(job_id=j, name="toy", state=self.state, reason="None", nodes="node[1-2]", exit_code=None,
                             signal=None, submit_time=0.0, start_time=0.0, end_time=0.0) for j in job_ids}

    def accounting(self, job_ids):
        self.calls += 1
        return {}


def a_run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "toy")
    (run.path / "jobs" / "7").mkdir(parents=True)
    append_run_event(run.journal_path, Created(at=1.0, name="toy"))
    append_run_event(run.journal_path, Submitted(at=2.0, attempt=1, job_id="7"))
    return run


class RunClock(FakeClock):
    """Appends to the journal as the watch goes: a straggler at 10 s, the run's end at 70 s."""

    def __init__(self, run: RunDir) -> None:
        super().__init__()
        self.start, self.run = self.t, run

    def sleep(self, seconds: float) -> None:
        before = self.t - self.start
        super().sleep(seconds)
        for when, event in ((10.0, STRAGGLER), (70.0, RunEnded(kind=EventKind.DONE, at=70.0))):
            if before < when <= self.t - self.start:
                append_run_event(self.run.journal_path, event)


def test_over_a_run_directory_slurm_is_asked_at_most_once_per_30_seconds(tmp_path):
    run = a_run(tmp_path)
    slurm, lines, notes = CountingSlurm(), [], []
    reads = RunFiles(run, slurm, notes.append)
    skip_history(reads)
    code = watch_run(reads, LineView(lines.append), RunClock(run), 2.0)
    assert code == 0
    assert slurm.calls <= 70.0 / SLURM_EVERY_S + 1
    shown = [line.split(" ", 1)[1] for line in lines]
    assert shown[0].startswith("toy RUNNING; attempt 1 (job 7)")
    assert any(line.startswith("job 7: straggler node3") for line in shown)
    assert shown[-2:] == ["run done", "toy done; attempt 1 (job 7); ETA unknown: neither the spec nor the program "
                                      "names a total step count"]


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


LIVE_ON_A_PTY = """
from rich.live import Live
from clusterctl.terminal_view import terminal
from clusterctl.launcher.login.watch import watch_run
from clusterctl.launcher.login.watch_view import LiveView
from tests.unit.test_status_watch import DONE, RUNNING, STRAGGLER, FakeClock, ScriptedReads
console = terminal()
with Live(console=console, auto_refresh=False) as live:
    code = watch_run(ScriptedReads([([], RUNNING), ([STRAGGLER], None), ([], DONE)]),
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
    assert "watch ended 0 True" in text
    assert "\x1b[?25h" in text  # the cursor shown again: the terminal restored


def test_watch_asks_for_one_run_and_a_sane_interval():
    no_run = CliRunner().invoke(cli, ["status", "--watch"])
    assert no_run.exit_code == 2 and "--watch needs one RUN or JOB" in no_run.output
    too_fast = CliRunner().invoke(cli, ["status", "/runs/toy", "--watch", "--interval", "0.1"])
    assert too_fast.exit_code == 2 and "0.1 is not in the range 0.5<=x<=60.0" in too_fast.output
