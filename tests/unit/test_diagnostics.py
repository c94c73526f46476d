"""Active diagnostics: DCGM's `dcgmi diag -j` output and a site's own command read into a verdict, the runner's
timeouts and bounded output, [diagnostics] in healthd.toml, the journal's records, and the prolog's pre-flight."""

from __future__ import annotations

import json
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import ConfigError, HealthdConfig, config_from_mapping
from clusterctl.healthd.diagnostic_runner import diagnostics_in_force, run_diagnostic
from clusterctl.healthd.diagnostics import EXCERPT_CHARS, DiagnosticSpec, Diagnostics, read_dcgmi, read_exit_code
from clusterctl.prolog.run import run_prolog
from clusterctl.records.healthd_diagnostic import DiagnosticResult, read_diagnostics
from clusterctl.records.healthd_node_record import read_node_record
from tests.fakes import FakePartition


def dcgm(*tests: tuple[str, str, list[dict]]) -> str:
    """A `dcgmi diag -j` document with these (category, test, results)."""
    categories: dict[str, list] = {}
    for category, name, results in tests:
        categories.setdefault(category, []).append({"name": name, "results": results})
    return json.dumps({"DCGM GPU Diagnostic": {
        "test_categories": [{"category": c, "tests": t} for c, t in categories.items()], "version": "3.3.9"}})


PASSING = dcgm(("Deployment", "Denylist", [{"gpu_ids": "0,1", "status": "Pass"}]),
               ("Hardware", "GPU Memory", [{"gpu_ids": "0", "status": "Pass"}, {"gpu_ids": "1", "status": "Skip"}]))


def test_dcgmi_all_passed_with_exit_0_is_a_pass():
    assert read_dcgmi(0, PASSING).outcome == "pass"


def test_dcgmi_a_failed_test_fails_and_names_the_test_the_gpu_and_dcgm_s_message():
    doc = dcgm(("Stress", "Diagnostic", [{"gpu_ids": "0", "status": "Pass"},
                                         {"gpu_ids": "3", "status": "Fail",
                                          "warnings": [{"warning": "SM stress: miscompare", "error_id": 9}]}]))
    verdict = read_dcgmi(226, doc)
    assert verdict.outcome == "fail" and "Diagnostic gpu3: SM stress: miscompare" in verdict.summary


def test_dcgmi_older_upper_case_statuses_and_string_warnings_are_read():
    doc = dcgm(("Hardware", "GPU Memory", [{"gpu_ids": "1", "status": "FAIL", "warnings": ["bad page"]}]))
    assert read_dcgmi(226, doc).summary == "failed: GPU Memory gpu1: bad page"


def test_dcgmi_warnings_pass_and_say_so():
    doc = dcgm(("Stress", "Targeted Power", [{"gpu_ids": "0", "status": "Warn", "warnings": ["power capped"]}]))
    verdict = read_dcgmi(0, doc)
    assert verdict.outcome == "pass" and "power capped" in verdict.summary


def test_dcgmi_non_zero_exit_without_a_failed_test_fails():
    assert read_dcgmi(226, PASSING).outcome == "fail"


def test_dcgmi_a_warning_line_before_the_json_is_skipped():
    assert read_dcgmi(0, "WARNING: something\n" + PASSING).outcome == "pass"


def test_dcgmi_output_that_is_not_its_json_is_an_error_never_a_pass():
    for text in ("", "Error: unable to connect to host engine", "{not json", "[]", dcgm()):
        assert read_dcgmi(0, text).outcome == "error", text


@given(st.text(max_size=300), st.integers(min_value=-255, max_value=255))
def test_dcgmi_reader_never_raises_and_passes_only_on_exit_0(text, code):
    verdict = read_dcgmi(code, text)
    assert verdict.outcome in ("pass", "fail", "error")
    assert code == 0 or verdict.outcome != "pass"
    assert len(verdict.summary) <= EXCERPT_CHARS and "\n" not in verdict.summary


def test_exit_code_parser_keeps_the_output_tail_as_evidence():
    assert read_exit_code(0, "ok").outcome == "pass"
    verdict = read_exit_code(3, "line 1\nGPU 2 failed memtest\n")
    assert verdict.outcome == "fail" and verdict.summary.startswith("exit code 3:") and "GPU 2 failed" in verdict.summary


def spec(code: str, timeout: float = 10.0, parser: str = "exit-code") -> DiagnosticSpec:
    return DiagnosticSpec((sys.executable, "-c", code), timeout, parser)  # type: ignore[arg-type]


def test_runner_runs_an_argv_and_judges_its_exit():
    assert run_diagnostic(spec("print('ok')"), "before_return").outcome == "pass"
    failed = run_diagnostic(spec("import sys; print('GPU 1 bad'); sys.exit(4)"), "before_return")
    assert (failed.outcome, failed.exit_code) == ("fail", 4) and "GPU 1 bad" in failed.excerpt


def test_runner_kills_a_diagnostic_past_its_timeout():
    began = time.monotonic()
    result = run_diagnostic(spec("import time; print('started', flush=True); time.sleep(60)", timeout=5.0),
                            "before_return")  # 5 s: the interpreter starts slowly on a loaded machine
    assert result.outcome == "timeout" and time.monotonic() - began < 20 and "started" in result.excerpt


def test_runner_a_shorter_budget_cuts_the_spec_s_timeout():
    assert run_diagnostic(spec("import time; time.sleep(60)"), "preflight", timeout=0.3).outcome == "timeout"


def test_runner_output_is_bounded_and_one_line():
    result = run_diagnostic(spec("import sys; sys.stdout.write('x\\x1b[31m\\n' * 300_000); sys.exit(1)"),
                            "before_return")
    assert result.outcome == "fail" and len(result.excerpt) <= EXCERPT_CHARS
    assert "\x1b" not in result.excerpt and "\n" not in result.excerpt


def test_runner_a_missing_command_is_an_error():
    result = run_diagnostic(DiagnosticSpec(("/nonexistent/dcgmi", "diag"), 5.0, "dcgmi"), "preflight")
    assert result.outcome == "error" and "cannot run /nonexistent/dcgmi" in result.summary


def test_config_reads_each_level():
    config = config_from_mapping({"diagnostics": {
        "before_return": {"argv": ["/usr/bin/dcgmi", "diag", "-r", "3", "-j"], "timeout": 1800, "parser": "dcgmi"},
        "preflight": {"argv": ["/opt/site/gpu-burn-check"], "timeout": 5}}})
    assert config.diagnostics is not None
    assert config.diagnostics.before_return == DiagnosticSpec(("/usr/bin/dcgmi", "diag", "-r", "3", "-j"), 1800.0,
                                                              "dcgmi")
    assert config.diagnostics.preflight == DiagnosticSpec(("/opt/site/gpu-burn-check",), 5.0, "exit-code")
    assert config.diagnostics.after_failure is None


@pytest.mark.parametrize(("entry", "says"), [
    ({"argv": "/usr/bin/dcgmi diag -r 3"}, "never a shell command line"),
    ({"argv": ["dcgmi", "diag"]}, "must be an absolute path"),
    ({"argv": []}, "list of 1 to"),
    ({"argv": ["/bin/x"], "parser": "xml"}, "parser must be one of dcgmi, exit-code"),
    ({"argv": ["/bin/x"], "timeout": 0}, "diagnostics.before_return.timeout"),
    ({"argv": ["/bin/x"], "shell": True}, "unknown key 'shell'"),
    ("dcgmi", "must be a table"),
])
def test_config_refuses_a_bad_diagnostic_with_what_to_write(entry, says):
    with pytest.raises(ConfigError, match="diagnostics.before_return") as caught:
        config_from_mapping({"diagnostics": {"before_return": entry}})
    assert says in str(caught.value)


def test_config_refuses_an_unknown_level():
    with pytest.raises(ConfigError, match="unknown key `diagnostics.after_repair`"):
        config_from_mapping({"diagnostics": {"after_repair": {"argv": ["/bin/true"]}}})


def test_defaults_dcgm_levels_when_dcgmi_is_installed_else_none_said():
    found = diagnostics_in_force(HealthdConfig(), which=lambda name: "/usr/bin/dcgmi")
    assert [s.argv[3] for s in (found.preflight, found.after_failure, found.before_return) if s] == ["1", "2", "3"]
    none = diagnostics_in_force(HealthdConfig(), which=lambda name: None)
    assert not none.any and "none configured" in none.describe()[0]
    off = diagnostics_in_force(config_from_mapping({"diagnostics": {}}), which=lambda name: "/usr/bin/dcgmi")
    assert not off.any  # an empty [diagnostics] turns DCGM's defaults off


def test_record_round_trips():
    result = DiagnosticResult("before_return", "dcgmi diag -r 3 -j", "fail", 1.7e9, 912.5, 226, "failed: x", "tail")
    assert DiagnosticResult.from_json(json.loads(json.dumps(result.to_json())), "here") == result


# ---- the prolog's pre-flight -------------------------------------------------------------------

@pytest.fixture()
def prolog_config(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                         kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                         tier_bases=(), checks=CheckLimits(expected_gpus=0), hook_timeout=20.0,
                         diagnostics=Diagnostics(preflight=spec("pass", timeout=30.0), source="test"))


def clean(*args, **kwargs):
    from clusterctl.healthd.gate import GateReport
    return GateReport()


def test_a_failed_preflight_refuses_the_job_with_the_diagnostic_s_evidence(prolog_config, capsys):
    slurm = FakePartition(20)
    asked: list[float] = []

    def failing(spec, level, timeout=None):
        asked.append(timeout)
        return DiagnosticResult(level, spec.name, "fail", time.time(), 1.0, 226, "failed: Diagnostic gpu0: miscompare",
                                "...Fail...")

    assert run_prolog({"SLURM_JOB_ID": "7"}, slurm, prolog_config, node_check=clean, diagnostic_door=failing) == 1
    assert slurm.drains and slurm.drains[0].startswith("healthd: diagnostic-failed [")
    assert "job 7 refused on node3: diagnostic-failed" in capsys.readouterr().err
    assert 0 < asked[0] <= 10.0  # within half of hook_timeout: the drain has the rest
    assert "miscompare" in read_node_record(prolog_config.journal_dir)[0].problems[0]
    assert read_diagnostics(prolog_config.journal_dir)[0].outcome == "fail"


@pytest.mark.parametrize("outcome", ["pass", "timeout", "error"])
def test_a_preflight_that_does_not_fail_lets_the_job_in(prolog_config, capsys, outcome):
    slurm = FakePartition(20)

    def door(spec, level, timeout=None):
        return DiagnosticResult(level, spec.name, outcome, time.time(), summary="host engine not running")

    assert run_prolog({"SLURM_JOB_ID": "8"}, slurm, prolog_config, node_check=clean, diagnostic_door=door) == 0
    assert slurm.drains == []
    assert ("let in" in capsys.readouterr().err) is (outcome != "pass")


def test_without_a_preflight_configured_nothing_runs(prolog_config):
    def door(spec, level, timeout=None):
        raise AssertionError("ran a diagnostic")

    config = HealthdConfig(**{**prolog_config.__dict__, "diagnostics": Diagnostics()})
    assert run_prolog({"SLURM_JOB_ID": "9"}, FakePartition(20), config, node_check=clean, diagnostic_door=door) == 0
