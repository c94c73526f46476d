"""The experiment record: what each attempt ran (resolved spec, command, code and data versions, clusterctl's
version), written once per attempt and shown by `clusterctl report`.

The record round-trips through its file and refuses what it does not understand; the spec's data version
label is free text with bounds; the workdir's code version is asked of git (for real where a test can make
the case, through the fake door where it cannot), and whatever git cannot say is recorded as unknown with
the reason, never a failed submission.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import clusterctl.launcher.login.cli as cli_module
from clusterctl import __version__
from clusterctl.errors import SpecError
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.code_version import probe_code_version, run_git
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.launcher.shared.runs import create_run
from clusterctl.records.experiment_record import (
    MAX_DATA_VERSION, CodeVersion, ExperimentRecord, read_experiment_record, write_experiment_record,
)
from clusterctl.records.run_journal import Submitted
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Completed, Slurm
from tests.conftest import REPO
from tests.fakes import FakeGit

COMMIT = "3f9c2a1b" * 5
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)
one_line_text = st.text(max_size=100).filter(str.isprintable)
code_versions = st.builds(
    CodeVersion, workdir=st.text(max_size=200),
    commit=st.none() | st.text("0123456789abcdef", min_size=40, max_size=40),
    dirty=st.none() | st.booleans(), unknown=st.none() | one_line_text)
records = st.builds(
    ExperimentRecord, attempt=st.integers(1, 10_000), recorded_at=st.floats(0, 4e9),
    clusterctl_version=one_line_text, command=st.lists(st.text(), max_size=8).map(tuple),
    data_version=st.none() | st.text(max_size=MAX_DATA_VERSION), code=code_versions,
    spec=st.dictionaries(st.text(), json_values, max_size=6))


# ---- the record --------------------------------------------------------------------------------
@given(record=records)
def test_a_record_reads_back_as_written(tmp_path_factory, record):
    folder = tmp_path_factory.mktemp("attempt")
    path = write_experiment_record(folder, record)
    assert read_experiment_record(folder) == record
    assert os.stat(path).st_mode & 0o077 == 0, "the spec may hold secrets: the record is its owner's alone"


VALID = ExperimentRecord(1, 5.0, "0.2.0", ("python3", "train.py"), "c4-v2", CodeVersion("/w", "3f" * 20, False),
                         {"kind": "run-spec", "version": 1}).to_json()
garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)
FIELD_NAMES = st.sampled_from(sorted(VALID) + ["code.workdir", "code.commit", "code.dirty", "code.unknown"])


@settings(max_examples=150, deadline=None)
@given(value=garbage, field_name=FIELD_NAMES, mode=st.sampled_from(["whole", "one field"]))
def test_a_record_of_any_shape_is_read_or_refused_never_a_crash(value, field_name, mode):
    data = value
    if mode == "one field":  # a valid record with one field (or one field of its code version) replaced
        data = json.loads(json.dumps(VALID))
        where, _, key = field_name.rpartition(".")
        (data[where] if where else data)[key] = value
    try:
        ExperimentRecord.from_json(data, "experiment.json")
    except RecordError as refused:
        assert str(refused).startswith("experiment.json")


def test_an_attempt_without_a_record_has_none(tmp_path):
    assert read_experiment_record(tmp_path) is None


def _written(tmp_path: Path, **changes: object) -> Path:
    record = ExperimentRecord(1, 5.0, "0.2.0", ("python3", "train.py"), "c4-v2", CodeVersion("/w", COMMIT, False),
                              {"kind": "run-spec", "version": 1})
    path = write_experiment_record(tmp_path, record)
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


def test_a_record_from_a_newer_clusterctl_is_refused_saying_what_to_do(tmp_path):
    path = _written(tmp_path, version=2)
    with pytest.raises(RecordError) as refused:
        read_experiment_record(tmp_path)
    assert str(refused.value) == (f"{path}: experiment-record record version 2 is newer than this clusterctl "
                                  "understands (1); upgrade clusterctl on this host")


@pytest.mark.parametrize("changes, said", [
    ({"tags": ["a"]}, "unknown field `tags` (written by a newer clusterctl?)"),
    ({"code": {"workdir": "/w", "commit": "HEAD; rm -rf /", "dirty": False, "unknown": None}},
     "code: field `commit` is not a git object name (40 or 64 hexadecimal digits)"),
    ({"command": ["python3", 7]}, "field `command` must be a list of strings"),
    ({"data_version": "x" * (MAX_DATA_VERSION + 1)}, f"field `data_version` is longer than {MAX_DATA_VERSION}"),
    ({"spec": "job.toml"}, "field `spec` has the wrong type (str)"),
])
def test_a_damaged_record_is_refused_naming_the_field(tmp_path, changes, said):
    _written(tmp_path, **changes)
    with pytest.raises(RecordError) as refused:
        read_experiment_record(tmp_path)
    assert said in str(refused.value)


# ---- the data version label in the spec ----------------------------------------------------------
SPEC = """[job]
name = "llm"
nodes = 2
gpus_per_node = 4
{line}

[launch]
command = ["python3", "train.py"]
"""


@given(label=st.text(min_size=1, max_size=MAX_DATA_VERSION).filter(str.isprintable))
def test_a_data_version_label_is_kept_exactly_as_written(label):
    line = "data_version = " + json.dumps(label, ensure_ascii=False)
    assert parse_spec(SPEC.format(line=line), "job.toml", base_dir=REPO).job.data_version == label


def test_a_spec_without_a_data_version_has_none():
    spec = parse_spec(SPEC.format(line=""), "job.toml", base_dir=REPO)
    assert spec.job.data_version is None and spec.to_dict()["job"]["data_version"] is None


@pytest.mark.parametrize("value, said", [
    ('"' + "v" * (MAX_DATA_VERSION + 1) + '"', f"a label of at most {MAX_DATA_VERSION} printable characters"),
    ('"c4\\nv2"', "a string without control characters"),
    ('"c4\\u001b[2Jv2"', "a string without control characters"),
    ('"c4\\u202ev2"', "no invisible formatting characters"),
    ('""', "a non-empty string"),
    ("3", "expected a non-empty string, found a whole number 3"),
])
def test_a_bad_data_version_is_refused_with_file_line_and_key(value, said):
    with pytest.raises(SpecError) as refused:
        parse_spec(SPEC.format(line=f"data_version = {value}"), "job.toml", base_dir=REPO)
    assert str(refused.value).startswith("job.toml:5, key `job.data_version`: ") and said in str(refused.value)


# ---- the code version: real git where a test can make the case ------------------------------------
def _git(workdir: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(workdir), "-c", "user.name=t", "-c", "user.email=t@example.com", *argv],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    workdir = tmp_path / "proj"
    workdir.mkdir()
    _git(workdir, "init", "-q")
    (workdir / "train.py").write_text("print('step')\n")
    _git(workdir, "add", "train.py")
    _git(workdir, "commit", "-q", "-m", "first")
    return workdir


@needs_git
def test_a_clean_tree_is_its_commit(repo):
    assert probe_code_version(str(repo), run_git) == CodeVersion(str(repo), _git(repo, "rev-parse", "HEAD"), False)


@needs_git
def test_a_changed_tracked_file_makes_the_tree_dirty_and_a_new_untracked_file_does_not(repo):
    (repo / "notes.txt").write_text("not tracked\n")
    assert probe_code_version(str(repo), run_git).dirty is False
    (repo / "train.py").write_text("print('step', 2)\n")
    assert probe_code_version(str(repo), run_git).dirty is True


@needs_git
def test_a_folder_outside_any_git_tree_is_unknown_saying_so(tmp_path, monkeypatch):
    (tmp_path / "ceiling").mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert probe_code_version(str(tmp_path / "ceiling"), run_git) == \
        CodeVersion(str(tmp_path / "ceiling"), unknown="not a git tree")


@needs_git
def test_a_tree_without_a_commit_and_a_missing_workdir_are_unknown_saying_so(tmp_path):
    _git(tmp_path, "init", "-q")
    assert probe_code_version(str(tmp_path), run_git).unknown == "a git tree with no commit yet"
    assert probe_code_version(str(tmp_path / "gone"), run_git).unknown == \
        "the workdir cannot be entered here (missing, or not a directory this user may enter)"


@needs_git
def test_git_environment_variables_of_the_users_shell_do_not_point_the_probe_at_another_tree(repo, tmp_path,
                                                                                             monkeypatch):
    commit = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere" / ".git"))
    assert probe_code_version(str(repo), run_git).commit == commit


def test_without_git_on_path_the_version_is_unknown_saying_git_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert probe_code_version(str(tmp_path), run_git).unknown == "git is not installed here (not on PATH)"


def test_a_git_that_does_not_answer_in_time_is_cut_off_and_named(tmp_path, monkeypatch):
    slow = tmp_path / "git"
    slow.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    code = probe_code_version(str(tmp_path), run_git, timeout=0.3)
    assert code == CodeVersion(str(tmp_path), unknown="git gave no answer within 0.3 s (a very large or slow "
                                                      "repository?)")


# ---- the code version: what a test cannot make for real --------------------------------------------
def test_a_tree_owned_by_another_user_is_unknown_and_git_config_is_left_alone():
    git = FakeGit.owned_by_another_user("/home/bob/proj")
    code = probe_code_version("/home/bob/proj", git)
    assert (code.commit, code.dirty) == (None, None)
    assert code.unknown == ("a git tree owned by another user, which git refuses to read (its safe.directory check; "
                            "clusterctl does not change git's configuration)")
    assert [argv for argv, _ in git.calls] == [["-C", "/home/bob/proj", "rev-parse", "--verify", "HEAD"]]


def test_a_status_that_does_not_answer_in_time_keeps_the_commit_and_says_dirty_is_unknown():
    code = probe_code_version("/w", FakeGit.slow_status(COMMIT))
    assert (code.commit, code.dirty) == (COMMIT, None)
    assert code.unknown == ("whether tracked files changed is unknown: git gave no answer within 5 s (a very large "
                            "or slow repository?)")


def test_the_status_asked_skips_untracked_files_and_each_call_has_a_timeout():
    git = FakeGit.dirty(COMMIT)
    assert probe_code_version("/w", git, timeout=2.0) == CodeVersion("/w", COMMIT, True)
    assert git.calls == [(["-C", "/w", "rev-parse", "--verify", "HEAD"], 2.0),
                         (["-C", "/w", "status", "--porcelain", "--untracked-files=no"], 2.0)]


# ---- submit writes it; report shows it -----------------------------------------------------------
class _Sbatch:
    def __call__(self, argv, timeout) -> Completed:
        if argv[:2] == ["sbatch", "--version"]:
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        if argv[0] == "sbatch":
            return Completed(0, "7\n", "")
        if argv[:3] == ["scontrol", "show", "topology"]:
            return Completed(0, "", "")
        return Completed(1, "", f"unexpected {argv}")


@needs_git
def test_submit_records_what_the_attempt_runs_and_report_shows_it(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(_Sbatch()))
    spec_file = repo / "job.toml"
    spec_file.write_text(SPEC.format(line='data_version = "fineweb-edu@2024-06 [dedup]"')
                         + f'workdir = "{repo}"\n')
    (repo / "train.py").write_text("print('changed, not committed')\n")
    runner = CliRunner()
    dry = json.loads(runner.invoke(cli, ["submit", str(spec_file), "--dry-run", "--json",
                                         "--run-dir", str(tmp_path / "run")]).stdout)
    submitted = runner.invoke(cli, ["submit", str(spec_file), "--run-dir", str(tmp_path / "run")])
    assert submitted.exit_code == 0, submitted.output

    record = read_experiment_record(tmp_path / "run" / "attempts" / "1")
    assert record is not None
    assert record.command == tuple(dry["command"])
    assert record.code == CodeVersion(str(repo), _git(repo, "rev-parse", "HEAD"), True)
    assert (record.data_version, record.clusterctl_version) == ("fineweb-edu@2024-06 [dedup]", __version__)
    resolved = json.loads(runner.invoke(cli, ["spec", str(spec_file)]).stdout)
    assert {k: v for k, v in record.spec.items() if k not in ("kind", "version")} == resolved

    shown = " ".join(runner.invoke(cli, ["report", str(tmp_path / "run")]).stdout.split())
    assert (f"attempt 1: code git {record.code.commit[:12]} with uncommitted changes to tracked files, in {repo}; "
            f'data version "fineweb-edu@2024-06 [dedup]"; clusterctl {__version__} python3 train.py') in shown
    reported = json.loads(runner.invoke(cli, ["report", str(tmp_path / "run"), "--json"]).stdout)["experiment"]
    assert [(e["attempt"], e["code"]["commit"], e["data_version"]) for e in reported] == \
        [(1, record.code.commit, "fineweb-edu@2024-06 [dedup]")]
    assert "spec" not in reported[0], "the resolved spec may hold secrets: --json points at the record instead"


def test_report_says_which_attempts_have_no_record_and_why_one_cannot_be_read(tmp_path):
    run = create_run(tmp_path / "run", parse_spec(SPEC.format(line=""), "job.toml", base_dir=REPO), "")
    run.record(Submitted(at=1.0, attempt=1, job_id="4"))
    runner = CliRunner()
    shown = " ".join(runner.invoke(cli, ["report", str(run.path)]).stdout.split())
    assert "experiment: not recorded (the attempts were submitted by a clusterctl that did not record them)" in shown

    _written(run.attempt_dir(2), version=2)
    run.record(Submitted(at=2.0, attempt=2, job_id="5"))
    shown = " ".join(runner.invoke(cli, ["report", str(run.path)]).stdout.split())
    assert "attempt 1: no experiment record (submitted by a clusterctl that did not write one)" in shown
    assert "experiment-record record version 2 is newer than this clusterctl understands (1)" in shown


def test_text_from_a_record_is_shown_as_written_never_acted_on(tmp_path):
    """A record is a file: one edited by hand (or by another program) cannot repaint the terminal or
    reorder what it shows, and `[bold]` is text, not markup."""
    run = create_run(tmp_path / "run", parse_spec(SPEC.format(line=""), "job.toml", base_dir=REPO), "")
    write_experiment_record(run.attempt_dir(1), ExperimentRecord(
        1, 5.0, "0.2.0", ("python3", "train.py", "--tag", "a\nb"), "v1\x1b[2J\u202e[bold]x",
        CodeVersion("/w", COMMIT, False), {}))
    run.record(Submitted(at=1.0, attempt=1, job_id="4"))
    shown = " ".join(CliRunner().invoke(cli, ["report", str(run.path)]).stdout.split())
    assert 'data version "v1\\x1b[2J\\u202e[bold]x"' in shown and "\x1b" not in shown and "\u202e" not in shown
    assert "python3 train.py --tag 'a\\nb'" in shown
