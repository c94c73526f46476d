"""What a user sees from the command lines: help, plain 'not available yet', clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.launcher.login.cli import cli as clusterctl_cli
from tests.conftest import import_testbed

BIN = Path(sys.executable).parent


def test_clusterctl_help_lists_every_command():
    result = CliRunner().invoke(clusterctl_cli, ["--help"])
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"submit", "supervise", "status", "report", "cancel", "spec", "plan", "hostlist"}


def test_healthd_status_without_a_daemon_and_a_bad_config(tmp_path):
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(healthd_cli, ["status", "--config", str(config)])
    assert result.exit_code == 3 and "is healthd running on this node?" in result.output
    config.write_text("check_interval = 'often'\n")
    result = CliRunner().invoke(healthd_cli, ["run", "--config", str(config)])
    assert result.exit_code == 78
    assert "key `check_interval` must be a number" in result.output and "Traceback" not in result.output


def test_inject_rejects_an_unknown_fault_kind():
    bed_cli = import_testbed("cli").cli
    result = CliRunner().invoke(bed_cli, ["inject", "node3", "xid-storm"])
    assert result.exit_code == 2
    assert "unknown fault 'xid-storm'" in result.output
    assert "Traceback" not in result.output


def test_inject_needs_a_number_where_one_is_expected():
    bed_cli = import_testbed("cli").cli
    result = CliRunner().invoke(bed_cli, ["inject", "node3", "xid", "seventy-nine"])
    assert result.exit_code == 2
    assert "'seventy-nine' is not a number" in result.output


def test_installed_commands_exit_cleanly_with_a_message_on_a_wrong_node(tmp_path):
    import_testbed()  # its console script
    # Through the console script: TestbedError becomes one line and exit code 2, no traceback.
    env = {"CLUSTERCTL_TESTBED_DIR": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    out = subprocess.run([str(BIN / "clusterctl-testbed"), "inject", "node9", "xid", "79"], capture_output=True,
                         text=True, env=env, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == "clusterctl-testbed: no compute node 'node9'; the testbed has node1, node2, node3, node4"


def test_on_a_host_that_is_not_up_says_what_to_do(tmp_path):
    import_testbed()  # its console script
    env = {"CLUSTERCTL_TESTBED_DIR": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    out = subprocess.run([str(BIN / "clusterctl-testbed"), "on", "node1", "true"], capture_output=True, text=True,
                         env=env, timeout=30)
    assert out.returncode == 2
    assert "host node1 is not running; `clusterctl-testbed up`" in out.stderr


def _stale_state(tmp_path: Path) -> Path:
    """A state file healthd stopped writing an hour ago (its pid gone), and a config naming it."""
    import time

    from clusterctl.records.healthd_state import HealthdState, write_healthd_state

    write_healthd_state(tmp_path, HealthdState(node="n1", pid=999999999, policy_version="x",
                                               updated_at=time.time() - 3600, started="2026-11-22T00:00:00Z",
                                               nvml_ok=True))
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n')
    return config


def test_healthd_status_says_when_its_state_is_stale(tmp_path):
    config = _stale_state(tmp_path)
    result = CliRunner().invoke(healthd_cli, ["status", "--config", str(config)])
    assert result.exit_code == 3 and "stale" in result.output and "is not running" in result.output


def test_healthd_status_json_says_stale_and_exits_3_as_the_text_does(tmp_path):
    import json

    config = _stale_state(tmp_path)
    result = CliRunner().invoke(healthd_cli, ["status", "--json", "--config", str(config)])
    assert result.exit_code == 3
    shown = json.loads(result.output)
    assert shown["stale"] is True and 3590 < shown["age_seconds"] < 3700 and shown["node"] == "n1"


def test_versions_are_the_installed_package_version():
    from importlib.metadata import version

    result = CliRunner().invoke(healthd_cli, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"healthd, version {version('clusterctl')}"
    result = CliRunner().invoke(clusterctl_cli, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"clusterctl, version {version('clusterctl')}"
