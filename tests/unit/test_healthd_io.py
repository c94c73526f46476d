"""healthd's kernel-log reader, journal, config and Slurm door, with recorded Slurm output."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from clusterctl.healthd.config import ConfigError, config_from_mapping, load_config
from clusterctl.healthd.findings import Action
from clusterctl.healthd.kmsg import KernelLog, normalise_pci, parse_gpu_event, parse_record
from clusterctl.records.healthd_kmsg_cursor import KmsgCursor
from clusterctl.slurm.nodes import SlurmNode, parse_sinfo_json
from clusterctl.slurm.commands import Completed

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def test_nvrm_lines_parse():
    rec = parse_record("3,1207,8813213,-;NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, ch 5")
    assert rec is not None and rec.sequence == 1207
    own = {"0000:cb:00", "0000:05:00"}
    event = parse_gpu_event(rec, own)
    assert (event.pci_bus, event.xid) == ("0000:cb:00", 109)
    fallen = parse_gpu_event(parse_record("4,9,1,-;NVRM: GPU at PCI:0000:05:00: GPU has fallen off the bus."), own)
    assert (fallen.pci_bus, fallen.xid) == ("0000:05:00", 79)
    assert parse_gpu_event(parse_record("6,10,1,-;usb 1-1: new device"), own) is None
    assert parse_record(" SUBSYSTEM=pci") is None
    assert normalise_pci("00000000:5D:00.0") == "0000:5d:00"


def first_record(log, boot_id: str, cursor: KmsgCursor):
    for batch in KernelLog(log, boot_id, cursor).follow(threading.Event()):
        return batch[0]


def two_xids(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("3,1,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, old\n3,2,2,-;NVRM: Xid (PCI:0000:2a:00): 48, x\n")
    return log


def test_kernel_log_resumes_after_its_cursor(tmp_path):
    assert first_record(two_xids(tmp_path), "boot-a", KmsgCursor("boot-a", 1)).sequence == 2  # seq 1 handled


def test_a_cursor_from_another_boot_means_every_record_is_new(tmp_path):
    assert first_record(two_xids(tmp_path), "boot-b", KmsgCursor("boot-a", 2)).sequence == 1


def test_config_errors_name_file_and_key(tmp_path):
    path = tmp_path / "healthd.toml"
    path.write_text("check_interval = -1\n")
    with pytest.raises(ConfigError, match=r"healthd.toml:1: key `check_interval` must be a number"):
        load_config(path)
    with pytest.raises(ConfigError, match="unknown key `chek_interval`"):
        config_from_mapping({"chek_interval": 3})
    with pytest.raises(ConfigError, match="unknown key `checks.expected_gpu`"):
        config_from_mapping({"checks": {"expected_gpu": 4}})
    with pytest.raises(ConfigError, match="policy.promote_xids.999"):
        config_from_mapping({"policy": {"promote_xids": {"999": "explode"}}})
    path.write_text("[checks\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_a_config_error_is_one_of_the_families_clusterctl_reports_with_its_own_exit_code():
    from click.testing import CliRunner

    from clusterctl.errors import ClusterctlError
    from clusterctl.healthd.cli import cli

    with pytest.raises(ClusterctlError) as raised:
        config_from_mapping({"check_interval": "often"})
    assert isinstance(raised.value, ConfigError) and raised.value.exit_code == 78  # EX_CONFIG, as before
    result = CliRunner().invoke(cli, ["status", "--config", "/nonexistent/healthd.toml"])
    assert result.exit_code == 78 and "healthd: error: /nonexistent/healthd.toml: cannot read" in result.output


def test_a_valid_config_sets_what_it_says():
    config = config_from_mapping({"dry_run": True, "checks": {"expected_gpus": 4},
                                  "policy": {"promote_xids": {"999": "drain-reset"}}})
    assert config.dry_run and config.checks.expected_gpus == 4
    assert config.policy.promote_xids == {999: Action.DRAIN_RESET}


def recorded(name: str):
    text = (DATA / name).read_text()
    return lambda argv, timeout: Completed(0, text, "")


def test_node_state_from_recorded_sinfo_json():
    nodes = {n.name: n for n in parse_sinfo_json((DATA / "sinfo-json-admin-drain.json").read_text())}
    assert nodes["node2"].drained_by_someone_else and not nodes["node2"].drained_by_us
    assert not nodes["node1"].draining and nodes["node1"].partitions == ("gpu",)
    ours = {n.name: n for n in parse_sinfo_json((DATA / "sinfo-json-healthd-drain.json").read_text())}
    assert ours["node3"].drained_by_us
    assert SlurmNode("node3", recorded("26.05/sinfo-one-node-node3.txt")).state().drained_by_us


def test_drain_passes_the_reason_as_one_argument():
    calls = []
    node = SlurmNode("node3", lambda argv, timeout: calls.append(argv) or Completed(0, "", ""))
    node.drain('healthd: xid 79 gpu3 $(reboot) "; rm -rf /')
    assert calls == [["scontrol", "update", "NodeName=node3", "State=DRAIN",
                      'Reason=healthd: xid 79 gpu3 $(reboot) "; rm -rf /']]


def test_the_one_host_sampler_skips_a_path_it_cannot_read():
    from clusterctl.healthd.sampler import sample_host

    sample = sample_host(["/", "/nonexistent-healthd-path"])
    assert list(sample.disk_free_fraction) == ["/"] and 0 < sample.memory_available_fraction <= 1
