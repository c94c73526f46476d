"""A run journal that is damaged, or not a file at all: every reader says so, and what it may have cost.

A damaged line in the middle of a journal is skipped by the replay, and `report`, `status` and
`supervise` say which line, what it seems to have held and what losing it may cost; a directory,
a FIFO or a huge file where the journal should be is a RecordError (exit 10), never an internal
error or a hang.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.errors import ClusterctlError
from clusterctl.files import JOURNAL_LIMIT, append_json_line
from clusterctl.launcher.login.cli import main
from clusterctl.launcher.login.report import report_renderables
from clusterctl.launcher.login.supervisor import Hooks, Supervisor
from clusterctl.launcher.login.use_cases import gather_report, gather_status
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import RunDir, create_run
from clusterctl.records.run_journal import (
    Created, Decided, DecisionAction, EventKind, OutcomeKind, RunEnded, Submitted, append_run_event, event_to_json,
    read_run_journal,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO

DECIDED = Decided(at=4.0, attempt=1, job_id="7", state="FAILED", exit_code=1, outcome=OutcomeKind.NODE_FAILURE,
                  message="blamed node3", blame=(), checkpoint_step=None, checkpoint=None,
                  action=DecisionAction.RESUBMIT)


def damaged_in_the_middle(path: Path) -> None:
    """created, submitted, a `decided` line damaged by a stray byte, then a second submission."""
    append_run_event(path, Created(at=1.0, name="toy"))
    append_run_event(path, Submitted(at=2.0, attempt=1, job_id="7"))
    line = json.dumps(event_to_json(DECIDED), sort_keys=True)
    with path.open("a") as journal:
        journal.write(line[:40] + "\x01" + line[41:] + "\n")
    append_run_event(path, Submitted(at=5.0, attempt=2, job_id="8"))


def test_a_damaged_line_in_the_middle_is_named_with_what_it_may_have_cost(tmp_path):
    journal = tmp_path / "journal.jsonl"
    damaged_in_the_middle(journal)
    read = read_run_journal(journal)
    assert [e.event for e in read.events] == [EventKind.CREATED, EventKind.SUBMITTED, EventKind.SUBMITTED]
    [damage] = read.damaged
    assert (damage.line, damage.event, damage.last) == (3, EventKind.DECIDED, False)
    [warning] = read.warnings
    assert "journal line 3 is damaged and was skipped" in warning
    assert "a `decided` event is lost" in warning and "attempts and restarts may be counted wrong" in warning


def test_a_line_naming_no_event_still_says_counts_may_be_off(tmp_path):
    journal = tmp_path / "journal.jsonl"
    append_run_event(journal, Created(at=1.0, name="toy"))
    journal.write_bytes(journal.read_bytes() + b"\xff\xfe garbage\n")
    append_run_event(journal, Submitted(at=2.0, attempt=1, job_id="7"))
    [warning] = read_run_journal(journal).warnings
    assert "journal line 2" in warning and "unknown kind" in warning and "\\ufffd" in warning


def test_an_event_appended_after_a_torn_line_starts_a_line_of_its_own(tmp_path):
    journal = tmp_path / "journal.jsonl"
    append_run_event(journal, Created(at=1.0, name="toy"))
    with journal.open("a") as out:
        out.write('{"kind": "run-event", "version": 1, "event": "subm')  # a crash mid-append
    append_run_event(journal, DECIDED)  # the next supervisor's decision must not be lost with it
    read = read_run_journal(journal)
    assert read.events == (Created(at=1.0, name="toy"), DECIDED)
    assert read.unreadable_lines == (2,)


def test_append_json_line_to_an_empty_file_adds_no_blank_line(tmp_path):
    path = tmp_path / "j.jsonl"
    path.touch()
    append_json_line(path, {"a": 1})
    assert path.read_text() == '{"a": 1}\n'


@pytest.mark.parametrize("shape", ["directory", "fifo", "huge"])
def test_a_journal_that_is_not_a_journal_file_is_a_record_error(tmp_path, shape):
    journal = tmp_path / "journal.jsonl"
    if shape == "directory":
        journal.mkdir()
    elif shape == "fifo":
        os.mkfifo(journal)  # nobody writes it: reading it whole would wait forever
    else:
        with journal.open("wb") as out:
            out.truncate(JOURNAL_LIMIT + 1)  # sparse: no disk, but far too much to hold
    started = time.monotonic()
    with pytest.raises(RecordError, match="not a readable run journal") as refused:
        read_run_journal(journal)
    assert time.monotonic() - started < 5
    assert {"directory": "a directory", "fifo": "a FIFO", "huge": "bytes, more than"}[shape] in str(refused.value)


def make_run(root: Path) -> RunDir:
    return create_run(root / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")


def test_status_and_report_of_a_run_whose_journal_is_a_directory_exit_10(tmp_path, monkeypatch, capsys):
    run = make_run(tmp_path)
    run.journal_path.unlink()
    run.journal_path.mkdir()
    for command in ("report", "status"):
        monkeypatch.setattr(sys, "argv", ["clusterctl", command, str(run.path)])
        with pytest.raises(SystemExit) as exited:
            main()
        err = capsys.readouterr().err
        assert exited.value.code == 10, err
        assert "internal error" not in err and "journal.jsonl: not a readable run journal: a directory" in err


def test_report_shows_the_damaged_line_in_text_and_json(tmp_path):
    run = make_run(tmp_path)
    run.journal_path.unlink()
    damaged_in_the_middle(run.journal_path)
    report = gather_report(run, now=10.0)
    [warning] = report.journal_warnings
    assert "journal line 3" in warning and "`decided`" in warning
    assert report.to_json()["journal_warnings"] == [warning]
    from rich.console import Console
    console = Console(width=400, record=True)
    console.print(report_renderables(report))
    assert f"warning: {warning}" in console.export_text()


def test_status_says_which_line_was_skipped(tmp_path):
    run = make_run(tmp_path)
    run.journal_path.unlink()
    damaged_in_the_middle(run.journal_path)

    def runner(argv, timeout):
        if argv[0] == "sbatch":
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        return Completed(0, json.dumps({"jobs": []}), "")
    notes: list[str] = []
    gather_status([run], Slurm(runner), notes.append)
    assert len(notes) == 1 and notes[0].startswith(f"warning: {run.journal_path}: journal line 3 is damaged")


def test_the_supervisor_says_the_damaged_line_once(tmp_path):
    run = make_run(tmp_path)
    damaged_in_the_middle(run.journal_path)
    append_run_event(run.journal_path, RunEnded(kind=EventKind.DONE, at=6.0, message="the run completed"))
    said: list[str] = []
    supervisor = Supervisor(run, Slurm(lambda argv, timeout: Completed(0, "", "")), sys.executable,
                            hooks=Hooks(say=said.append, sleep=lambda s: None))
    assert supervisor.supervise() == 0
    damaged = [line for line in said if "journal line 4 is damaged" in line]
    assert len(damaged) == 1 and "`decided` event is lost" in damaged[0]


# ---- any bytes: a clear error or a correct result ---------------------------------------------
journal_lines = st.one_of(
    st.binary(max_size=120),
    st.sampled_from([json.dumps(event_to_json(e), sort_keys=True).encode() for e in (
        Created(at=1.0, name="toy"), Submitted(at=2.0, attempt=1, job_id="7"), DECIDED,
        RunEnded(kind=EventKind.CANCELLED, at=6.0, jobs=("7",)))]),
    st.sampled_from([b'{"event": "decided", "at": NaN}', b'{"kind": "run-event", "version": 99}', b"[" * 5000,
                     b'{"event": "submitted", "at": 1e999, "attempt": 1, "job_id": "7"}', b"\x00", b"{}"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(journal_lines, max_size=8), st.booleans())
def test_any_journal_bytes_read_or_are_refused_clearly(lines: list[bytes], final_newline: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "journal.jsonl"
        path.write_bytes(data)
        try:
            read = read_run_journal(path)
        except ClusterctlError as exc:
            assert str(exc).startswith(str(path)), "the error names the journal"
            return
    # Every line is an event or named as damaged, never silently dropped.
    lines = data.split(b"\n")
    count = len(lines) - (lines[-1] == b"")
    assert len(read.events) + len(read.damaged) == count
    assert all(f"journal line {d.line} " in w for d, w in zip(read.damaged, read.warnings))
