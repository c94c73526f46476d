"""healthd.toml: any value for any key gives a valid config or one ConfigError naming file, line and key;
never a traceback, never NaN or infinity (issue 27).  Every command and hook reads it through load_config."""

from __future__ import annotations

import dataclasses
import datetime
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import clusterctl.healthd.config as healthd_config
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.healthd.config import (
    ConfigError, HealthdConfig, config_from_mapping, config_keeping_valid, load_config, load_config_keeping_valid,
)

TOP = [f.name for f in dataclasses.fields(HealthdConfig) if f.name not in ("checks", "policy", "prove")]
CHECKS = [f"checks.{f.name}" for f in dataclasses.fields(CheckLimits)]
POLICY = ["policy.promote_xids", "policy.app_xid_repeat", "policy.app_xid_window_h", "policy.app_xid_count"]
KEYS = TOP + CHECKS + POLICY

scalars = (st.booleans() | st.integers() | st.integers(-(2**63), 2**63 - 1) | st.floats()
           | st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1.5, 1e308, 2**64])
           | st.text(max_size=20) | st.sampled_from(["", "/", "/tmp", "rel/dir", "127.0.0.1:9400", "[::1]:9400",
                                                     "host:99999", "host:http", ":", "drain-reset", "users"])
           | st.datetimes() | st.dates() | st.times())
toml_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5) | st.sampled_from(["79", "999", "-1", "0"]), inner,
                                             max_size=3), max_leaves=6)


def nested(key: str, value: object) -> dict:
    table, _, name = key.partition(".")
    return {table: {name: value}} if name else {key: value}


def assert_sane(config: HealthdConfig) -> None:
    """Every number of an accepted config is finite; the ranges hold."""
    for holder in (config, config.checks, config.policy):
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name)
            if isinstance(value, float):
                assert math.isfinite(value), item.name
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert value >= 0, item.name


@settings(max_examples=600, deadline=None)
@given(key=st.sampled_from(KEYS + ["unknown", "checks.unknown", "policy.unknown"]), value=toml_values)
def test_any_value_for_any_key_is_a_config_or_a_config_error(key, value):
    try:
        config = config_from_mapping(nested(key, value), "/etc/clusterctl/healthd.toml")
    except ConfigError as exc:
        assert str(exc).startswith("/etc/clusterctl/healthd.toml") and f"`{key.split('.')[0]}" in str(exc)
        return
    assert_sane(config)


@settings(max_examples=200, deadline=None)
@given(table=st.sampled_from(["checks", "policy"]), value=toml_values)
def test_a_table_that_is_not_a_table_is_a_config_error(table, value):
    try:
        config_from_mapping({table: value})
    except ConfigError:
        return
    assert isinstance(value, dict)


@pytest.mark.parametrize("line, key", [
    ("[checks]\nexpected_gpus = inf", "checks.expected_gpus"),  # every node would miss a GPU and drain
    ("[checks]\nexpected_gpus = 8.5", "checks.expected_gpus"),
    ("[checks]\ntemperature_sustain_s = nan", "checks.temperature_sustain_s"),
    ("[checks]\nmemory_min_available = -inf", "checks.memory_min_available"),
    ("[checks]\ndisk_min_free = 7", "checks.disk_min_free"),
    ("[checks]\nretired_pages_limit = 99999999999999999999", "checks.retired_pages_limit"),
    ("[policy]\napp_xid_repeat = inf", "policy.app_xid_repeat"),
    ("[policy]\napp_xid_window_h = nan", "policy.app_xid_window_h"),
    ("[policy]\npromote_xids = 5", "policy.promote_xids"),
    ("[policy]\npromote_xids = { \"-3\" = \"drain\" }", "policy.promote_xids.-3"),
    ("[policy]\npromote_xids = { \"79\" = 4 }", "policy.promote_xids.79"),
    ("[policy]\napp_xid_count = 3", "policy.app_xid_count"),
    ("metrics = \"localhost:http\"", "metrics"),
    ("metrics = \"localhost:99999\"", "metrics"),
    ("metrics = \"9400\"", "metrics"),
    ("node = \"-n1 --help\"", "node"),
    ("partition = \"gpu,debug\"", "partition"),
    ("state_dir = \"run/healthd\"", "state_dir"),
    ("journal_dir = \"/var/lib/\\u0000x\"", "journal_dir"),
    ("disk_paths = [\"/\", 3]", "disk_paths"),
    ("check_interval = nan", "check_interval"),
    ("nvml_timeout = 1979-05-27", "nvml_timeout"),
])
def test_each_bad_value_names_file_line_and_key(tmp_path, line, key):
    path = tmp_path / "healthd.toml"
    path.write_text("# healthd\n\n" + line + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    number = 4 if "\n" in line else 3
    assert str(caught.value).startswith(f"{path}:{number}: key `{key}` must ")


def test_a_valid_config_reads_as_written(tmp_path):
    path = tmp_path / "healthd.toml"
    path.write_text('metrics = "[::1]:9401"\nnode = "node7"\npartition = "gpu"\ndisk_paths = ["/", "/scratch"]\n'
                    "[checks]\nexpected_gpus = 4.0\ndisk_min_free = 0.05\n"
                    '[policy]\napp_xid_repeat = 3\napp_xid_window_h = 12\npromote_xids = { "79" = "drain_reset" }\n')
    config = load_config(path)
    assert (config.metrics, config.node, config.partition, config.disk_paths) == ("[::1]:9401", "node7", "gpu",
                                                                                   ("/", "/scratch"))
    assert config.checks.expected_gpus == 4 and isinstance(config.checks.expected_gpus, int)
    assert (config.policy.app_xid_repeat, config.policy.app_xid_window_s) == (3, 12 * 3600.0)
    assert_sane(config)


def test_the_defaults_pass_their_own_rules():
    defaults = HealthdConfig()
    written = {name: getattr(defaults, name) for name in TOP if getattr(defaults, name) is not None}
    written = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in written.items()}
    written["checks"] = dataclasses.asdict(defaults.checks)
    prove = dataclasses.asdict(defaults.prove)
    written["prove"] = {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in prove.items() if k != "limits"},
                        **prove["limits"]}
    assert config_from_mapping(written) == defaults


@pytest.mark.parametrize("command", [["status"], ["evidence"], ["breaker"], ["run", "--dry-run"]])
def test_every_command_refuses_a_bad_config_with_ex_config_and_one_line(tmp_path, command):
    path = tmp_path / "healthd.toml"
    path.write_text("[checks]\nexpected_gpus = inf\n")
    result = CliRunner().invoke(healthd_cli, [*command, "--config", str(path)])
    assert result.exit_code == 78, result.output
    assert f"healthd: error: {path}:2: key `checks.expected_gpus` must be a whole number between 0 and 1024" \
        in result.output and "Traceback" not in result.output


def test_the_hooks_default_config_gets_the_same_checks(tmp_path, monkeypatch):
    path = tmp_path / "healthd.toml"
    path.write_text("[policy]\npromote_xids = 5\n")
    monkeypatch.setattr(healthd_config, "DEFAULT_PATH", path)  # what the prolog, epilog and check read
    with pytest.raises(ConfigError, match=r"healthd.toml:2: key `policy.promote_xids` must be a table"):
        load_config(None)


@pytest.mark.parametrize("key", TOP + CHECKS)
def test_every_key_is_checked(key):
    with pytest.raises(ConfigError, match=f"key `{key}` must"):  # a key without a rule would be a KeyError
        config_from_mapping(nested(key, object()))


def test_a_datetime_is_no_number():
    with pytest.raises(ConfigError, match="check_interval"):
        config_from_mapping({"check_interval": datetime.time(1, 2)})


def test_a_kmsg_naming_a_directory_is_refused_naming_file_line_and_key(tmp_path):
    path = tmp_path / "healthd.toml"
    path.write_text(f'# healthd\nkmsg = "{tmp_path}"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (f"{path}:2: key `kmsg` must be the kernel log, /dev/kmsg (or a file of its records), "
                                 f"not the directory {tmp_path}")
    result = CliRunner().invoke(healthd_cli, ["run", "--dry-run", "--config", str(path)])
    assert result.exit_code == 78 and f"healthd: error: {path}:2: key `kmsg` must be the kernel log" in result.output
    records = tmp_path / "kmsg.txt"  # a file of records (the testbed's) is a kernel log
    path.write_text(f'kmsg = "{records}"\n')
    assert load_config(path).kmsg == records


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS + ["unknown", "checks.unknown", "policy.unknown"]), value=toml_values)
def test_for_the_hooks_a_bad_key_is_dropped_alone_and_the_good_ones_beside_it_hold(key, value):
    """What the strict reader refuses, the hooks' reader drops, that key only: a valid key beside it holds."""
    data = {"tier_bases": [], "journal_dir": "/srv/healthd", "checks": {"expected_gpus": 4}}
    table, _, name = key.partition(".")
    if name:
        data.setdefault(table, {})[name] = value
    else:
        data[key] = value
    kept = config_keeping_valid(data, "/etc/clusterctl/healthd.toml")
    assert_sane(kept.config)
    try:
        strict = config_from_mapping(data, "/etc/clusterctl/healthd.toml")
    except ConfigError as exc:
        assert kept.dropped and str(kept.dropped[0]) == str(exc)
        assert all(d.key == key or key.startswith(f"{d.key}.") or d.key.startswith(f"{key}.") for d in kept.dropped)
    else:
        assert (kept.config, kept.dropped) == (strict, ())
    if key not in ("tier_bases", "journal_dir", "checks.expected_gpus", "checks"):
        assert (kept.config.tier_bases, kept.config.journal_dir) == ((), Path("/srv/healthd"))
        assert kept.config.checks.expected_gpus == 4


def test_a_file_that_is_not_toml_at_all_is_still_an_error_for_the_hooks(tmp_path):
    path = tmp_path / "healthd.toml"
    path.write_text("tier_bases = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_keeping_valid(path)
