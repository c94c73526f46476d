"""The job's metrics as a node_exporter textfile: the exact text, its labels escaped; written by the agent
into the user's or the admins' directory while it runs, gone when the job ends (the agent removes it, on
SIGTERM too, and the epilog removes what an agent killed hard left); a bad setting is one line, never a
stopped job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from clusterctl.epilog.run import run_epilog
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import HealthdConfig, load_config
from clusterctl.healthd.gate import GateReport
from clusterctl.job_metrics_file import (
    TEXTFILE_DIR_ENV, AdminSetting, Destination, destination, is_job_file, read_admin_setting, remove_textfile,
    textfile_name,
)
from clusterctl.launcher.pure.job_metrics_text import escape_label_value, job_metrics_text
from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics, read_agent_summary
from tests.conftest import REPO
from tests.fakes import FakePartition
from tests.unit.test_allocation_agent import training_agent

TRAINING = TrainingMetrics(30.0, 4, 4, 32, 1.9, 1_638_400.0, 4.0e15, 0.126, 989.0, "nvml", "NVIDIA H100 80GB HBM3",
                           "", 2.31, 1200, 0, 0.8, 1200, 0)
SUMMARY = AgentSummary("4242", "0", 1795305600.0, 2.0, "watching", 4, 4, min_step=1199, max_step=1200,
                       training=TRAINING)

GOLDEN = '''\
# HELP clusterctl_job_summary_timestamp_seconds When the job's agent wrote the summary these come from
# TYPE clusterctl_job_summary_timestamp_seconds gauge
clusterctl_job_summary_timestamp_seconds{job_id="4242",run="llama-8b"} 1795305600
# HELP clusterctl_job_step The furthest step a rank of the job reported
# TYPE clusterctl_job_step gauge
clusterctl_job_step{job_id="4242",run="llama-8b"} 1200
# HELP clusterctl_job_nodes Nodes in the job's running step
# TYPE clusterctl_job_nodes gauge
clusterctl_job_nodes{job_id="4242",run="llama-8b"} 4
# HELP clusterctl_job_nodes_reporting Nodes whose reporter the agent heard within the silence limit
# TYPE clusterctl_job_nodes_reporting gauge
clusterctl_job_nodes_reporting{job_id="4242",run="llama-8b"} 4
# HELP clusterctl_job_steps_per_second Training steps per second (median over the nodes)
# TYPE clusterctl_job_steps_per_second gauge
clusterctl_job_steps_per_second{job_id="4242",run="llama-8b"} 1.9
# HELP clusterctl_job_tokens_per_second Tokens per second, summed over the job's nodes
# TYPE clusterctl_job_tokens_per_second gauge
clusterctl_job_tokens_per_second{job_id="4242",run="llama-8b"} 1638400
# HELP clusterctl_job_flops_per_second Model FLOP/s, summed over the job's nodes
# TYPE clusterctl_job_flops_per_second gauge
clusterctl_job_flops_per_second{job_id="4242",run="llama-8b"} 4000000000000000
# HELP clusterctl_job_mfu_ratio Model FLOPs utilisation (0-1) against the GPUs' peak
# TYPE clusterctl_job_mfu_ratio gauge
clusterctl_job_mfu_ratio{job_id="4242",run="llama-8b"} 0.126
# HELP clusterctl_job_loss The loss the program last reported
# TYPE clusterctl_job_loss gauge
clusterctl_job_loss{job_id="4242",run="llama-8b"} 2.31
# HELP clusterctl_job_grad_norm The gradient norm the program last reported
# TYPE clusterctl_job_grad_norm gauge
clusterctl_job_grad_norm{job_id="4242",run="llama-8b"} 0.8
'''


def test_the_jobs_metrics_as_node_exporter_reads_them():
    assert job_metrics_text(SUMMARY, "llama-8b") == GOLDEN


def test_what_the_program_does_not_report_is_left_out_not_zero():
    text = job_metrics_text(AgentSummary("7", "0", 10.0, 2.0, "watching", 2, 1), "toy")
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names == ["clusterctl_job_summary_timestamp_seconds", "clusterctl_job_nodes", "clusterctl_job_nodes_reporting"]


def test_a_nan_loss_is_exported_as_nan():
    text = job_metrics_text(replace(SUMMARY, training=replace(TRAINING, loss=float("nan"))), "toy")
    assert 'clusterctl_job_loss{job_id="4242",run="toy"} NaN\n' in text


def test_a_run_name_with_quotes_backslashes_and_newlines_is_escaped():
    assert escape_label_value('a "b" \\c\nd') == 'a \\"b\\" \\\\c\\nd'
    text = job_metrics_text(SUMMARY, 'evil"} 1\nfake_metric 2')
    assert 'run="evil\\"} 1\\nfake_metric 2"' in text
    assert "fake_metric" not in [f.name for f in text_string_to_metric_families(text)]


@given(st.text(max_size=40))
def test_any_run_name_reads_back_as_written_on_every_series(name):
    families = list(text_string_to_metric_families(job_metrics_text(SUMMARY, name)))
    assert len(families) == 10
    assert {s.labels["run"] for f in families for s in f.samples} == {name}
    assert all(set(s.labels) == {"job_id", "run"} for f in families for s in f.samples)


# ---- the agent: written while it runs, removed when it ends ------------------------------------------

def exporting_agent(tmp_path, environ=None, admin=None):
    """The training agent of test_allocation_agent (job 42, run "toy"), with what it says kept, and at each
    of its sleeps whether the job's file is in `tmp_path / "textfiles"`."""
    shell = training_agent(tmp_path / "job")
    shell.environ = {**shell.environ, **(environ or {})}
    shell.doors.admin_metrics = lambda: admin or AdminSetting()
    said, present = [], []
    shell.doors.say = said.append
    sleep = shell.doors.sleep

    def looking(seconds):
        present.append((tmp_path / "textfiles" / "clusterctl_job_42.prom").exists())
        sleep(seconds)
    shell.doors.sleep = looking
    return shell, said, present


def test_the_agent_keeps_the_textfile_current_while_it_runs_and_removes_it_when_the_job_ends(tmp_path):
    (tmp_path / "textfiles").mkdir()
    shell, said, present = exporting_agent(tmp_path, {TEXTFILE_DIR_ENV: str(tmp_path / "textfiles")})

    assert shell.run(None) == 0

    assert textfile_name("42") == "clusterctl_job_42.prom"
    assert f"the job's metrics go to {tmp_path}/textfiles/clusterctl_job_42.prom (from {TEXTFILE_DIR_ENV}) " \
           "while this agent runs" in said
    assert present[-1] is True and present.count(True) > len(present) // 2  # written at the first summary on
    assert list((tmp_path / "textfiles").iterdir()) == []  # the job ended: nothing left for node_exporter


def test_the_text_written_is_the_summarys(tmp_path):
    (tmp_path / "textfiles").mkdir()
    shell, _, _ = exporting_agent(tmp_path, {TEXTFILE_DIR_ENV: str(tmp_path / "textfiles")})
    seen = []
    looking = shell.doors.sleep

    def reading(seconds):
        path = tmp_path / "textfiles" / "clusterctl_job_42.prom"
        if path.exists():
            seen.append((path.read_text(), read_agent_summary(shell.job_dir)))
        looking(seconds)
    shell.doors.sleep = reading
    assert shell.run(None) == 0
    text, summary = seen[-1]
    assert summary is not None and text == job_metrics_text(summary, "toy")


class Killed(BaseException):
    """The process dying of the signal (what the real door does after the cleanup)."""


def test_on_sigterm_the_agent_removes_the_textfile_before_it_dies(tmp_path):
    (tmp_path / "textfiles").mkdir()
    shell, _, _ = exporting_agent(tmp_path, {TEXTFILE_DIR_ENV: str(tmp_path / "textfiles")})
    handlers, after = [], []
    shell.doors.on_terminate = handlers.append
    looking = shell.doors.sleep

    def cancelled_at_20s(seconds):
        looking(seconds)
        if shell.doors.monotonic() >= 20 and not after:  # scancel: Slurm's SIGTERM to the batch script
            after.append(sorted(p.name for p in (tmp_path / "textfiles").iterdir()))
            [cleanup] = handlers
            cleanup()
            after.append(sorted(p.name for p in (tmp_path / "textfiles").iterdir()))
            raise Killed
    shell.doors.sleep = cancelled_at_20s

    with pytest.raises(Killed):
        shell.run(None)
    assert after == [["clusterctl_job_42.prom"], []]


def test_the_real_sigterm_door_runs_the_cleanup_then_the_process_dies_of_the_signal(tmp_path):
    program = f"""
import pathlib, sys, time
from clusterctl.launcher.job.agent_doors import cleanup_on_sigterm
left = pathlib.Path({str(tmp_path / "clusterctl_job_7.prom")!r})
left.write_text("x 1\\n")
cleanup_on_sigterm(left.unlink)
print("ready", flush=True)
time.sleep(60)
"""
    child = subprocess.Popen([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == -signal.SIGTERM  # as Slurm sees an agent without the handler
    assert list(tmp_path.iterdir()) == []


# ---- where: the user's environment, else the admins' healthd.toml ------------------------------------

def test_the_admins_directory_serves_every_job_and_the_users_variable_overrides_it(tmp_path):
    config = tmp_path / "healthd.toml"
    config.write_text('job_metrics_dir = "/run/node_exporter/textfile"\n[checks]\nexpected_gpus = 8\n')
    admin = read_admin_setting(config)

    assert admin == AdminSetting("/run/node_exporter/textfile")
    assert load_config(config).job_metrics_dir == Path("/run/node_exporter/textfile")  # healthd reads the same key
    assert destination({}, admin) == Destination(Path("/run/node_exporter/textfile"),
                                                 "job_metrics_dir in /etc/clusterctl/healthd.toml")
    assert destination({TEXTFILE_DIR_ENV: "/home/u/textfile"}, admin) == Destination(Path("/home/u/textfile"),
                                                                                   TEXTFILE_DIR_ENV)
    assert destination({TEXTFILE_DIR_ENV: ""}, admin).directory is None  # set empty: the user's job exports nothing
    assert destination({}, read_admin_setting(tmp_path / "absent.toml")) == Destination(None)


def test_the_agent_writes_into_the_admins_directory_without_any_setting_of_the_user(tmp_path):
    (tmp_path / "textfiles").mkdir()
    shell, said, present = exporting_agent(tmp_path, admin=AdminSetting(str(tmp_path / "textfiles")))
    assert shell.run(None) == 0
    assert any(p for p in present)
    assert any(line.endswith("(from job_metrics_dir in /etc/clusterctl/healthd.toml) while this agent runs")
               for line in said)


@pytest.mark.parametrize("environ, admin, line", [
    ({TEXTFILE_DIR_ENV: "textfiles"}, AdminSetting(),
     f"{TEXTFILE_DIR_ENV}='textfiles' is not an absolute path: the job's metrics are not exported (name "
     "node_exporter's --collector.textfile.directory)"),
    ({TEXTFILE_DIR_ENV: "{tmp}/missing"}, AdminSetting(),
     f"{TEXTFILE_DIR_ENV} names {{tmp}}/missing, which does not exist: the job's metrics are not exported"),
    ({TEXTFILE_DIR_ENV: "{tmp}/a-file"}, AdminSetting(),
     f"{TEXTFILE_DIR_ENV} names {{tmp}}/a-file, which is not a directory: the job's metrics are not exported"),
    ({}, AdminSetting("{tmp}/missing"),
     "job_metrics_dir in /etc/clusterctl/healthd.toml names {tmp}/missing, which does not exist: the job's "
     "metrics are not exported"),
    ({}, AdminSetting(problem="/etc/clusterctl/healthd.toml: job_metrics_dir = 'textfile' is not an absolute path"),
     "/etc/clusterctl/healthd.toml: job_metrics_dir = 'textfile' is not an absolute path: the job's metrics are not "
     f"exported (the admins' setting; {TEXTFILE_DIR_ENV} in the job's environment overrides it)"),
])
def test_a_setting_the_agent_cannot_use_is_one_line_in_its_log_and_the_job_goes_on(tmp_path, monkeypatch,
                                                                                   environ, admin, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    tmp = str(tmp_path)
    environ = {k: v.replace("{tmp}", tmp) for k, v in environ.items()}
    admin = AdminSetting(admin.directory.replace("{tmp}", tmp), admin.problem) if admin.directory else admin
    shell, said, _ = exporting_agent(tmp_path, environ, admin)

    assert shell.run(None) == 0
    assert [s for s in said if "metrics" in s] == [line.replace("{tmp}", tmp)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "job"]  # nothing made, nothing written


def as_another_user(ask):
    """`ask()` in a forked child running as nobody (uid 65534) when this is root, who writes anywhere."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its answer goes back through the pipe, then it ends at once
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, str(ask()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    os.waitpid(child, 0)
    return said


def test_a_directory_the_job_cannot_write_is_said_with_the_jobs_uid():
    import tempfile

    from clusterctl.job_metrics_file import directory_problem
    place = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        place.chmod(0o755)
        (place / "textfile").mkdir(mode=0o755)  # root's, as node_exporter's own directory usually is
        if os.geteuid() == 0:
            said, uid = as_another_user(lambda: directory_problem(place / "textfile")), 65534
        else:
            (place / "textfile").chmod(0o555)
            said, uid = str(directory_problem(place / "textfile")), os.getuid()
        assert said == f"is not writable by this job (uid {uid})"
    finally:
        (place / "textfile").chmod(0o755)
        shutil.rmtree(place)


def test_healthd_toml_the_agent_cannot_read_is_a_problem_not_an_error(tmp_path):
    broken = tmp_path / "healthd.toml"
    broken.write_text("job_metrics_dir = [unclosed\n")
    assert read_admin_setting(broken).problem.startswith(f"cannot read {broken} (")
    broken.write_text("job_metrics_dir = 3\n")
    assert read_admin_setting(broken) == AdminSetting(problem=f"{broken}: job_metrics_dir = 3 is not a path")


@given(st.integers(1, 10**9), st.integers(1, 10**9))
def test_one_jobs_files_are_never_another_jobs(a, b):
    name, temp = textfile_name(str(a)), f".{textfile_name(str(a))}.123.0a1b2c3d.tmp"
    assert is_job_file(name, str(a)) and is_job_file(temp, str(a))
    assert is_job_file(name, str(b)) == is_job_file(temp, str(b)) == (a == b)


# ---- the epilog: what an agent killed hard left, removed by root without following a link -----------

def epilog_config(tmp_path, textfiles):
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                         kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                         checks=CheckLimits(expected_gpus=0), job_metrics_dir=textfiles)


def healthy(*args, **kwargs):
    return GateReport()


def test_the_epilog_removes_the_jobs_file_an_agent_killed_hard_left_and_nothing_else(tmp_path, capsys):
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    for name in ("clusterctl_job_42.prom", ".clusterctl_job_42.prom.31337.deadbeef.tmp", "clusterctl_job_421.prom",
                 "clusterctl_job_4.prom", "node_gpu.prom"):
        (textfiles / name).write_text("x 1\n")

    assert run_epilog({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node3"}, FakePartition(20),
                      epilog_config(tmp_path, textfiles), node_check=healthy) == 0

    assert sorted(p.name for p in textfiles.iterdir()) == ["clusterctl_job_4.prom", "clusterctl_job_421.prom",
                                                           "node_gpu.prom"]
    assert (f"clusterctl-epilog: job 42: removed clusterctl_job_42.prom, .clusterctl_job_42.prom.31337.deadbeef.tmp "
            f"from {textfiles} (its agent did not)") in capsys.readouterr().err.splitlines()


def test_the_epilog_says_nothing_when_the_agent_removed_its_file(tmp_path, capsys):
    (tmp_path / "textfiles").mkdir()
    run_epilog({"SLURM_JOB_ID": "42"}, FakePartition(20), epilog_config(tmp_path, tmp_path / "textfiles"),
               node_check=healthy)
    said = capsys.readouterr().err
    assert "metrics" not in said and "removed" not in said


def test_the_epilog_removes_a_link_planted_at_the_jobs_name_never_what_it_points_to(tmp_path):
    textfiles, precious = tmp_path / "textfiles", tmp_path / "precious"
    textfiles.mkdir()
    precious.write_text("root's\n")
    (textfiles / "clusterctl_job_42.prom").symlink_to(precious)

    run_epilog({"SLURM_JOB_ID": "42"}, FakePartition(20), epilog_config(tmp_path, textfiles), node_check=healthy)

    assert list(textfiles.iterdir()) == [] and precious.read_text() == "root's\n"


def test_the_epilog_does_not_follow_a_symlink_where_the_directory_should_be(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "clusterctl_job_42.prom").write_text("x 1\n")
    (tmp_path / "textfiles").symlink_to(elsewhere)

    assert run_epilog({"SLURM_JOB_ID": "42"}, FakePartition(20), epilog_config(tmp_path, tmp_path / "textfiles"),
                      node_check=healthy) == 0

    assert [p.name for p in elsewhere.iterdir()] == ["clusterctl_job_42.prom"]
    assert any(line.startswith(f"clusterctl-epilog: job 42: cannot remove its metrics file from job_metrics_dir "
                               f"{tmp_path}/textfiles (") and line.endswith(": name the real directory, not a "
                                                                            "symlink to it")
               for line in capsys.readouterr().err.splitlines())


def test_a_directory_planted_under_a_temp_files_name_does_not_keep_the_jobs_figures_exported(tmp_path):
    exported = tmp_path / "textfiles"
    exported.mkdir()
    (exported / "clusterctl_job_42.prom").write_text("clusterctl_job_step 1\n")
    (exported / ".clusterctl_job_42.prom.1.x.tmp").mkdir()  # another user's, in the 1777 directory
    assert remove_textfile(exported, "42", follow_symlinks=False) == ["clusterctl_job_42.prom"]
    assert sorted(p.name for p in exported.iterdir()) == [".clusterctl_job_42.prom.1.x.tmp"]


def test_another_user_who_creates_a_jobs_metrics_file_first_cannot_export_forged_figures_under_its_id(capsys):
    """nobody (65534) creates clusterctl_job_61.prom in the shared 1777 textfile directory before uid 65533's job
    61 starts on the node.  The job's prolog (root) gives the name to the job's user: the job's agent replaces it
    with its figures, and nobody can neither replace nor remove it again."""
    import tempfile

    from clusterctl.prolog.run import run_prolog
    from clusterctl.job_metrics_file import write_textfile
    from tests.as_user import as_user

    if os.geteuid() != 0:
        pytest.skip("plays two users: needs root to become them")
    victim, squatter = 65533, 65534
    place = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        place.chmod(0o755)
        textfile = place / "textfile"
        textfile.mkdir()
        textfile.chmod(0o1777)
        forged = 'clusterctl_job_step{job_id="61",run="r"} 999999\n'
        assert as_user(squatter, lambda: write_textfile(textfile, "61", forged)) == ("ok", None)
        config = HealthdConfig(node="node3", state_dir=place / "run", journal_dir=place / "lib", kmsg=place / "kmsg",
                               job_records_dir=place / "records", disk_paths=(), tier_bases=(),
                               job_metrics_dir=textfile, checks=CheckLimits(expected_gpus=0))
        env = {"SLURM_JOB_ID": "61", "SLURM_JOB_UID": str(victim), "SLURM_JOB_GID": str(victim)}
        assert run_prolog(env, FakePartition(20), config, node_check=lambda *a, **k: GateReport(problems=[])) == 0
        assert (f"job 61: {textfile}/clusterctl_job_61.prom was a file of uid {squatter} (nobody), not of the job's "
                f"uid {victim} (made first by another user): replaced with the job's own, empty") \
            in capsys.readouterr().err

        honest = 'clusterctl_job_step{job_id="61",run="r"} 40\n'
        assert as_user(victim, lambda: write_textfile(textfile, "61", honest)) == ("ok", None)
        assert (textfile / "clusterctl_job_61.prom").read_text() == honest
        assert (textfile / "clusterctl_job_61.prom").stat().st_uid == victim
        outcome, _ = as_user(squatter, lambda: write_textfile(textfile, "61", forged))
        assert outcome == "raised" and (textfile / "clusterctl_job_61.prom").read_text() == honest
    finally:
        shutil.rmtree(place)

