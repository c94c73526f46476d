"""`healthd install`: the unit and example config an admin gets out of the installed package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from clusterctl import __version__
from clusterctl.healthd.cli import cli
from clusterctl.healthd.config import HealthdConfig, config_from_mapping
from clusterctl.healthd.metrics import Metrics
from clusterctl.healthd.unit_file import packaged_text, paths_outside_unit, start_warnings

REPO = Path(__file__).resolve().parents[2]
HEALTHD = str(Path(sys.executable).parent / "healthd")


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "healthd.toml"
    path.write_text(text)
    return path


def _unit(tmp_path: Path, text: str = "", *extra: str) -> str:
    result = CliRunner().invoke(cli, ["install", "--print-unit", "--config", str(_config(tmp_path, text)),
                                      "--healthd", HEALTHD, *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_printed_unit_starts_the_installed_healthd_with_the_given_config(tmp_path):
    unit = _unit(tmp_path)
    assert f"ExecStart={HEALTHD} run --config {tmp_path / 'healthd.toml'} --log-format json" in unit
    assert "/opt/clusterctl" not in unit and "@" not in unit.split("[Unit]", 1)[1]
    documentation = next(line for line in unit.splitlines() if line.startswith("Documentation="))
    assert documentation.startswith("Documentation=file:/") and documentation.endswith("install.md")
    assert Path(documentation.removeprefix("Documentation=file:")).read_text().startswith("# Installing clusterctl")


def test_a_shared_breaker_dir_is_writable_in_the_printed_unit(tmp_path):
    unit = _unit(tmp_path, 'breaker_dir = "/shared/healthd-breaker"\nstate_dir = "/run/healthd/x"\n')
    assert "ReadWritePaths=/run/healthd /var/lib/healthd -/shared/healthd-breaker\n" in unit
    assert "ProtectHome=yes\n" in unit


def test_a_writable_dir_under_home_makes_protect_home_read_only_not_hidden(tmp_path):
    unit = _unit(tmp_path, 'journal_dir = "/home/healthd/journal"\n')
    assert "ProtectHome=read-only\n" in unit and "-/home/healthd/journal" in unit


def test_the_old_unit_left_a_shared_breaker_dir_read_only_and_the_derived_one_does_not(tmp_path):
    config = config_from_mapping({"breaker_dir": "/shared/healthd-breaker", "journal_dir": "/var/lib/healthd/j"})
    old = "ProtectSystem=strict\nReadWritePaths=/run/healthd /var/lib/healthd\n"
    assert [str(p) for p in paths_outside_unit(config, old)] == ["/shared/healthd-breaker"]
    printed = _unit(tmp_path, 'breaker_dir = "/shared/healthd-breaker"\njournal_dir = "/var/lib/healthd/j"\n')
    assert paths_outside_unit(config, printed) == ()


def test_healthd_warns_at_start_about_a_directory_it_cannot_write(tmp_path):
    breaker = tmp_path / "breaker"
    breaker.mkdir()
    config = HealthdConfig(state_dir=tmp_path, journal_dir=tmp_path / "not-yet" / "journal", breaker_dir=breaker)
    warnings = start_warnings(config, None, can_write=lambda path: path not in (breaker, tmp_path))
    assert [w.split(": under systemd")[0] for w in warnings] == [  # state_dir, journal_dir, breaker_dir
        f"healthd cannot write {tmp_path}", f"healthd cannot create {tmp_path / 'not-yet/journal'} in {tmp_path}",
        f"healthd cannot write {breaker}"]
    assert all("ReadWritePaths" in w for w in warnings)
    assert start_warnings(config, None, can_write=lambda path: True) == []


def test_healthd_warns_at_start_when_the_installed_unit_leaves_a_directory_read_only():
    config = config_from_mapping({"breaker_dir": "/shared/healthd-breaker"})
    old = "[Service]\nProtectSystem=strict\nReadWritePaths=/run/healthd /var/lib/healthd\n"
    warnings = start_warnings(config, old, can_write=lambda path: True)
    assert warnings == ["/etc/systemd/system/healthd.service leaves /shared/healthd-breaker read-only "
                        "(ProtectSystem=strict): add it to the unit's ReadWritePaths (`healthd install --print-unit "
                        "--config <your healthd.toml>` derives them)"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_printed_unit_passes_systemd_analyze_verify(tmp_path):
    if not Path(HEALTHD).is_file():
        pytest.skip(f"no installed healthd at {HEALTHD} for ExecStart to name")
    unit = tmp_path / "units" / "healthd.service"
    unit.parent.mkdir()
    unit.write_text(_unit(tmp_path, 'breaker_dir = "/shared/healthd-breaker"\n'))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # Units named in After=/Wants= that this machine lacks (nvidia-persistenced) are not the unit's fault.
    problems = [line for line in result.stderr.splitlines() if "healthd.service" in line and "nvidia" not in line]
    assert result.returncode == 0 and not problems, result.stderr


def test_print_config_is_the_packaged_example(tmp_path):
    result = CliRunner().invoke(cli, ["install", "--print-config"])
    assert result.exit_code == 0 and result.output == packaged_text("healthd.example.toml")
    assert result.output == (REPO / "healthd" / "healthd.example.toml").read_text()


def test_prefix_writes_unit_and_config_and_never_overwrites_without_force(tmp_path):
    args = ["install", "--prefix", str(tmp_path / "root"), "--healthd", HEALTHD]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    unit = tmp_path / "root/etc/systemd/system/healthd.service"
    config = tmp_path / "root/etc/clusterctl/healthd.toml"
    assert "ExecStart=" in unit.read_text() and config.read_text() == packaged_text("healthd.example.toml")
    assert unit.stat().st_mode & 0o777 == 0o644 and unit.parent.stat().st_mode & 0o777 == 0o755
    config.write_text("# the admin's edits\n")
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 73 and "already exist" in again.output and "--force" in again.output
    assert config.read_text() == "# the admin's edits\n"
    assert not [p for p in config.parent.iterdir() if p.name.startswith(".")]  # no temp file left behind
    forced = CliRunner().invoke(cli, [*args, "--force"])
    assert forced.exit_code == 0 and config.read_text() == packaged_text("healthd.example.toml")


def test_install_needs_exactly_one_thing_to_do():
    assert CliRunner().invoke(cli, ["install"]).exit_code == 2
    assert CliRunner().invoke(cli, ["install", "--print-unit", "--print-config"]).exit_code == 2
    assert CliRunner().invoke(cli, ["install", "--print-unit", "--force"]).exit_code == 2


def test_metrics_default_port_is_not_dcgm_exporters_and_build_info_is_served():
    assert HealthdConfig().metrics == "127.0.0.1:9489"  # 9400 is dcgm-exporter's default
    text = generate_latest(Metrics().registry).decode()
    assert f'version="{__version__}"' in next(line for line in text.splitlines()
                                              if line.startswith("healthd_build_info{"))
