"""The testbed's emulated `dcgmi diag -r N -j`: its output read by healthd's real parser and runner, its
injected failures, and the testbed's healthd.toml that runs it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")
from clusterctl_testbed import slurm_config  # noqa: E402
from clusterctl_testbed.dcgmi_emu import (  # noqa: E402
    EXIT_TEST_FAILED, EXIT_USAGE, DiagFault, diag_document, inject_diag, main, write_dcgmi,
)
from clusterctl_testbed.layout import Layout  # noqa: E402

from clusterctl.healthd.config import config_from_mapping  # noqa: E402
from clusterctl.healthd.diagnostic_runner import run_diagnostic  # noqa: E402
from clusterctl.healthd.diagnostics import DiagnosticSpec, read_dcgmi  # noqa: E402


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_a_healthy_node_passes_every_level(level):
    text, code = diag_document(level, 8, [])
    assert code == 0 and read_dcgmi(code, text).outcome == "pass"


def test_more_levels_run_more_tests():
    counts = [diag_document(level, 2, [])[0].count('"status"') for level in (1, 2, 3)]
    assert counts[0] < counts[1] < counts[2]


def test_a_failure_injected_from_level_3_passes_r1_and_r2_and_fails_r3_with_its_message():
    fault = DiagFault("fail", 3, "Memory Bandwidth", 5, "bandwidth 1.2 TB/s below 2.0")
    assert read_dcgmi(*reversed(diag_document(2, 8, [fault]))).outcome == "pass"
    text, code = diag_document(3, 8, [fault])
    verdict = read_dcgmi(code, text)
    assert code == EXIT_TEST_FAILED and verdict.outcome == "fail"
    assert verdict.summary == "failed: Memory Bandwidth gpu5: bandwidth 1.2 TB/s below 2.0"


def test_unknown_argv_is_a_usage_error(tmp_path, capsys):
    assert main(["diag", "-r", "3"], tmp_path) == EXIT_USAGE
    assert main(["diag", "-r", "9", "-j"], tmp_path) == EXIT_USAGE
    assert "Usage: dcgmi diag" in capsys.readouterr().err


def test_the_node_s_dcgmi_script_runs_through_healthd_s_runner_with_injected_faults(tmp_path):
    node_dir = tmp_path / "node1"
    script = write_dcgmi(node_dir)
    spec = DiagnosticSpec((str(script), "diag", "-r", "3", "-j"), 30.0, "dcgmi")
    assert run_diagnostic(spec, "before_return").outcome == "pass"
    inject_diag(node_dir, DiagFault("fail", 2, "GPU Memory", 1, "page retirement pending"))
    failed = run_diagnostic(spec, "before_return")
    assert (failed.outcome, failed.exit_code) == ("fail", EXIT_TEST_FAILED)
    assert "GPU Memory gpu1: page retirement pending" in failed.summary
    inject_diag(node_dir, DiagFault("hang", seconds=30))
    assert run_diagnostic(spec, "before_return", timeout=0.5).outcome == "timeout"
    inject_diag(node_dir, DiagFault("clear"))
    assert run_diagnostic(spec, "before_return").outcome == "pass"


def test_the_testbed_s_healthd_toml_runs_each_node_s_own_dcgmi(tmp_path):
    layout = Layout(root=tmp_path)
    text = slurm_config.healthd_toml(layout, "node2")
    diagnostics = config_from_mapping(tomllib.loads(text)).diagnostics
    assert diagnostics is not None and diagnostics.before_return is not None and diagnostics.after_failure is not None
    assert diagnostics.before_return.argv == (str(layout.nvml_dir / "node2" / "bin" / "dcgmi"), "diag", "-r", "3", "-j")
    assert diagnostics.after_failure.parser == "dcgmi" and Path(diagnostics.after_failure.argv[0]).name == "dcgmi"
    assert diagnostics.preflight is None, "no pre-flight in every testbed prolog (it would move the hooks' figures)"
