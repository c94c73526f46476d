"""Text from outside reaches the terminal as written: never as rich markup, emoji codes or terminal controls.

Node reasons (an admin's, slurmd's, a health checker's), node names, Slurm's states, the journal's
messages and healthd's findings are shown by `clusterctl status`, `clusterctl report`, the
supervisor's say lines and live line, and `healthd status`.  Whatever they hold (`[/dev/nvidia3]`,
`[bold]`, `:smile:`, an escape sequence), each is shown as written (control characters as a visible
escape, `clusterctl.terminal_view.printable`) and never raises.
"""

from __future__ import annotations

import time
from io import StringIO
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console, RenderableType

from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.healthd.findings import Action
from clusterctl.launcher.login.report import report_renderables, run_report
from clusterctl.launcher.login.status import run_status, status_renderables
from clusterctl.launcher.login.supervisor import WatchSnapshot
from clusterctl.launcher.login.text_view import saying
from clusterctl.terminal_view import plain
from clusterctl.records.healthd_state import Alert, GpuState, HealthdState, StateFinding, write_healthd_state
from clusterctl.records.run_journal import (
    BlamedNode, Decided, DecisionAction, EventKind, OutcomeKind, RunEnded, SlurmTimes, Submitted,
)
from clusterctl.slurm.jobs import JobReport
from clusterctl.terminal_view import printable

HOSTILE = ("GPU gone [/dev/nvidia3]", "[maint]", "[bold]x[/bold]", "[/x]", "[", "]", "\\[", ":smile:",
           "\x1b[2J\x1b]0;owned\x07", "a\tb\rc\x00\x7f\x9b", "[link=http://x]y[/link]")
# Text as Slurm, an admin or root may write it: printable or not, markup-like or not (one line: a
# node reason or name has no newline; a message's lines are each checked).
external = st.one_of(st.sampled_from(HOSTILE),
                     st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40),
                     st.lists(st.sampled_from(["[", "]", "/", "bold", "x", " ", "=", ":", "\x1b", "smile"]),
                              max_size=12).map("".join))
WIDE = 100_000  # no wrapping: each piece must appear whole


def rendered(renderable: RenderableType) -> str:
    """As a console rich makes by default (markup and emoji on) renders it: the views must not depend on it."""
    out = StringIO()
    Console(file=out, width=WIDE, color_system=None).print(renderable)
    return out.getvalue()


def shown_as_written(text: str, output: str) -> bool:
    return printable(text).strip() in output


@settings(max_examples=150, deadline=None)
@given(reason=external, node=external, state=external, message=external)
def test_clusterctl_status_shows_slurms_text_as_written(reason, node, state, message):
    events = [Submitted(at=100.0, attempt=1, job_id="7"), RunEnded(kind=EventKind.STOPPED, at=200.0, message=message)]
    queue = {"7": JobReport("7", "toy", state, reason, node, None, None, 100.0, 110.0, 0.0)}
    output = rendered(status_renderables(run_status(Path("/runs/r"), events, {}, queue, {})))
    for text in (reason, node, state, message):
        assert shown_as_written(text, output), (text, output)


@settings(max_examples=150, deadline=None)
@given(reason=external, node=external, state=external, message=external, evidence=external)
def test_clusterctl_report_shows_the_journals_text_as_written(reason, node, state, message, evidence):
    blame = BlamedNode(node, reason, (evidence,), 9e12)
    events = [Submitted(at=100.0, attempt=1, job_id="7"),
              Decided(at=201.0, attempt=1, job_id="7", state=state, exit_code=3, outcome=OutcomeKind.NODE_FAILURE,
                      message=message, checkpoint_step=None, checkpoint=None, action=DecisionAction.STOP,
                      times=SlurmTimes(100.0, 110.0, 200.0), blame=(blame,)),
              RunEnded(kind=EventKind.STOPPED, at=201.0, message=message)]
    output = rendered(report_renderables(run_report(Path("/runs/r"), events, [], [], 300.0)))
    for text in (reason, node, state, message, evidence):
        assert shown_as_written(text, output), (text, output)


@settings(max_examples=150, deadline=None)
@given(reason=external, node=external, state=external)
def test_the_supervisors_say_and_live_lines_show_slurms_text_as_written(reason, node, state):
    out = StringIO()
    say = saying(Console(file=out, width=WIDE, color_system=None), lambda: "12:00:00")
    say(f"attempt 1: ending job 7 now: {node}: node down ({reason})")
    assert shown_as_written(f"{node}: node down ({reason})", out.getvalue())
    live = rendered(plain(WatchSnapshot(1, "7", state, node, ((node, reason),), None).line()))
    for text in (reason, node, state):
        assert shown_as_written(text, live), (text, live)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(node=external, detail=external, uuid=external, alert=external)
def test_healthd_status_shows_roots_text_as_written(tmp_path, node, detail, uuid, alert):
    finding = StateFinding(kind="xid", action=Action.DRAIN_RESET, reason="r", source="kmsg", at_ts=time.time(),
                           xid=79, gpu=0, detail=detail)
    write_healthd_state(tmp_path, HealthdState(
        node=node, pid=999999999, policy_version="x", updated_at=time.time(), started="2026-11-22T00:00:00Z",
        nvml_ok=True, gpus=(GpuState(0, uuid, "0000:5d:00", (finding,)),), node_findings=(finding,),
        alerts=(Alert("2026-11-22T00:00:00Z", "breaker-open", "r", alert),)))
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(healthd_cli, ["status", "--config", str(config)], env={"COLUMNS": str(WIDE)})
    assert result.exit_code == 3, result.output  # stale: no healthd runs as that pid; the state is shown all the same
    for text in (node, detail, uuid, alert):
        assert shown_as_written(text, result.output), (text, result.output)


def test_clusterctl_status_of_a_running_job_with_an_agent_says_who_reports_and_who_is_silent():
    from clusterctl.records.agent_summary import AgentSummary
    events = [Submitted(at=100.0, attempt=1, job_id="7")]
    queue = {"7": JobReport("7", "toy", "RUNNING", "None", "node[1-3]", None, None, 100.0, 110.0, 0.0)}
    agent = AgentSummary("7", "0", 1795305600.0, 2.0, "watching", 3, 2, silent=("node3",), min_step=118,
                         max_step=120, refused={"unsigned": 4})
    output = rendered(status_renderables(run_status(Path("/runs/r"), events, {}, queue, {}, None, agent)))
    assert "job 7 agent (watching, 2026-11-22T00:00:00Z)" in output
    assert "2/3 nodes reporting, steps 118-120; silent: node3; refused 4 reports (4 unsigned)" in output


@pytest.mark.parametrize("training, line", [
    (dict(steps_per_s=0.52, tokens_per_s=4.2e6, flops_per_s=1.6e16, mfu=0.404, peak_tflops=989.0, peak_from="nvml",
          gpu="NVIDIA H100 80GB HBM3\x1b[2J", loss=float("nan"), loss_step=118, loss_rank=0, grad_norm=float("inf"),
          grad_norm_step=118, grad_norm_rank=0),
     "step 120, 0.52 steps/s, 4,200,000 tokens/s, MFU 40.4% (peak 989 TFLOP/s per GPU from NVML's name "
     "'NVIDIA H100 80GB HBM3\\x1b[2J'), loss nan at step 118, grad norm inf at step 118"),
    (dict(steps_per_s=0.5, flops_per_s=2.5e15, mfu_missing="clusterctl does not know the peak of 'NVIDIA L40S': set "
          "[job] gpu_peak_tflops in the spec", nodes=2, nodes_reporting=3),
     "step 120, 0.5 steps/s, 2,500 TFLOP/s, MFU unknown: clusterctl does not know the peak of 'NVIDIA L40S': set "
     "[job] gpu_peak_tflops in the spec, rates from 2 of 3 nodes"),
    (dict(nodes=0, loss=2.31, loss_step=3, loss_rank=0),
     "step 120, rates: measuring (no node has reported twice within 30 s yet), loss 2.31 at step 3"),
])
def test_clusterctl_status_shows_the_programs_training_in_one_line(training, line):
    from clusterctl.records.agent_summary import AgentSummary, TrainingMetrics
    events = [Submitted(at=100.0, attempt=1, job_id="7")]
    queue = {"7": JobReport("7", "toy", "RUNNING", "None", "node[1-3]", None, None, 100.0, 110.0, 0.0)}
    metrics = TrainingMetrics(**{"window_s": 30.0, "nodes": 3, "nodes_reporting": 3, "gpus": 24, **training})
    agent = AgentSummary("7", "0", 1795305600.0, 2.0, "watching", 3, 3, min_step=118, max_step=120, training=metrics)
    output = rendered(status_renderables(run_status(Path("/runs/r"), events, {}, queue, {}, None, agent)))
    assert f"job 7 training (last 30 s): {line}" in " ".join(output.split())


CONTROLS = "\x1b\x07\x01\x7f\x9b\r\t\n\u202e\u2028"  # what a file name may hold (no NUL, no slash)
hostile_name = st.text(st.sampled_from(list(CONTROLS) + ["a", "[", "]", ".", "x"]), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=hostile_name)
def test_healthds_error_lines_show_a_planted_config_path_as_written(tmp_path, name):
    config = tmp_path / f"{name}.toml"
    config.write_text("state_dir = [unclosed\n")
    result = CliRunner().invoke(healthd_cli, ["status", "--config", str(config)])
    assert result.exit_code == 78
    [line] = result.output.splitlines()  # one line, whatever the name holds (its newline escaped)
    assert line.startswith("healthd: error: ") and "not valid TOML" in line
    assert not any(c in line for c in "\x1b\x07\x01\x7f\x9b\r\t")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=hostile_name)
def test_the_hooks_log_lines_in_slurmds_log_are_one_line_each_whatever_a_path_holds(tmp_path, capsys, name):
    from clusterctl.epilog.run import run_epilog

    config = tmp_path / f"{name}.toml"
    config.write_text("hook_timeout = [unclosed\n")
    assert run_epilog({"SLURM_JOB_ID": "x"}, config_path=config) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("clusterctl-epilog: ") for line in lines), lines
    assert not any(c in "".join(lines) for c in CONTROLS)
