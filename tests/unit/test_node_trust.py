"""Nobody can drain a node by feeding it data: what users can write never takes a node out of service.

Each story is one way an ordinary user (or one fault seen everywhere at once) could get a
node drained, or crash a root hook, before issue 18; the test says what happens now.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import pytest

from clusterctl.clock import Clock
from clusterctl.epilog.run import run_epilog
from clusterctl.files import UnsafePathError
from clusterctl.healthd import engine
from clusterctl.healthd.checks import CheckLimits, HostSample, check_host
from clusterctl.healthd.config import HealthdConfig, config_from_mapping
from clusterctl.healthd.daemon import Daemon, Observed
from clusterctl.healthd.engine import EngineSettings, EngineState, gate_verdict, step
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import GateReport, Problem
from clusterctl.healthd.healthcheck import run_health_check
from clusterctl.healthd.kmsg import KernelLog, parse_gpu_event, parse_record
from clusterctl.healthd.policy import PolicyConfig, judge
from clusterctl.prolog.run import run_prolog
from clusterctl.records.healthd_job_start import JobStart, write_job_start
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding, write_healthd_state
from clusterctl.records.healthd_xid_history import XidSighting, append_xid_sighting, read_xid_history
from clusterctl.records.job_health import JobHealthRecord, job_health_path, read_job_health, write_job_health
from tests.fakes import FakePartition

T0 = 1795305600.0
NODES = 20  # node3's partition
OWN = {"0000:18:00", "0000:2a:00"}


# ---- forged kernel-log lines -------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "14,5,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",  # user facility (1 << 3 | 6)
    '3,5,1,-;overlayfs: bad option "NVRM: Xid (PCI:0000:18:00): 79, pid=1"',  # user text inside a kernel message
    "4,5,1,-;EXT4-fs: NVRM: GPU at PCI:0000:18:00: GPU has fallen off the bus.",
    "3,5,1,-;NVRM: Xid (PCI:0000:77:00): 79, pid=1, GPU has fallen off the bus.",  # not this node's GPU
    "3,5,1,-;NVRM: GPU at PCI:0000:77:00: GPU has fallen off the bus.",
])
def test_a_forged_or_foreign_kernel_line_is_no_xid(line):
    record = parse_record(line)
    assert record is not None and parse_gpu_event(record, OWN) is None


def test_the_drivers_own_line_about_this_nodes_gpu_is_an_xid():
    event = parse_gpu_event(parse_record("3,5,1,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=1, dbe"), OWN)
    assert event is not None and (event.pci_bus, event.xid) == ("0000:2a:00", 48)


@pytest.fixture()
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                         kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                         metrics="", checks=CheckLimits(expected_gpus=0))


def healthy(*args, **kwargs) -> GateReport:
    return GateReport()


def test_the_epilog_does_not_blame_the_node_for_a_forged_kernel_line(config):
    # healthd's state names this node's GPUs and their PCI addresses (its pid is not alive: state is stale).
    write_healthd_state(config.state_dir, HealthdState(
        node="node3", pid=0, policy_version="x", updated_at=time.time(), started="2026-11-22T00:00:00Z", nvml_ok=True,
        gpus=(GpuState(0, "GPU-0", "0000:18:00"), GpuState(1, "GPU-1", "0000:2a:00"))))
    write_job_start(config.journal_dir, JobStart("51", time.time() - 30))
    now_usec = int(time.monotonic() * 1e6)
    config.kmsg.write_text(f"14,1,{now_usec},-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, forged by a user\n"
                           f'3,2,{now_usec},-;overlayfs: bad option "NVRM: Xid (PCI:0000:2a:00): 79, pid=1"\n')
    slurm = FakePartition(NODES)
    assert run_epilog({"SLURM_JOB_ID": "51", "SLURMD_NODENAME": "node3"}, slurm, config, node_check=healthy) == 0
    record = read_job_health(job_health_path(config.job_records_dir, "51", "node3"))
    assert record.findings == () and slurm.drains == []


# ---- ordinary job activity ---------------------------------------------------------------------

def test_a_full_tmp_warns_and_drains_only_a_path_the_site_opted_in_to():
    full = HostSample(disk_free_fraction={"/tmp": 0.0, "/var/lib/slurm": 0.0})
    findings = check_host(full, CheckLimits(), 0, drain_paths=("/var/lib/slurm",))
    verdicts = {f.value: judge(f).action for f in findings}
    assert verdicts == {"/tmp": Action.WARN, "/var/lib/slurm": Action.DRAIN_RESET}
    assert HealthdConfig().disk_drain_paths == ()  # by default no full path drains
    assert config_from_mapping({"disk_drain_paths": ["/var/lib/slurm"]}).watched_disk_paths == (
        "/", "/tmp", "/var/lib/slurm")


def xid13(gpu: int, at: float) -> Observed:
    return Observed("nvml-event", (Finding("xid", "nvml-event", at, gpu=gpu, xid=13),))


def test_one_app_xid_on_a_shared_node_is_the_one_jobs_and_drains_nothing(config):
    now = [T0]
    write_job_start(config.journal_dir, JobStart("101", T0 - 60, (0,), uid=1000))
    write_job_start(config.journal_dir, JobStart("102", T0 - 60, (1,), uid=1001))
    shell = Daemon(config, slurm=FakePartition(NODES, jobs=("101", "102"))("node3"), clock=Clock(now=lambda: now[0]))
    shell.handle(xid13(1, T0))
    assert shell.actions.empty(), "one Xid in one job is no repeat across jobs"
    assert [(s.job_ids, s.users) for s in read_xid_history(config.journal_dir)] == [(("102",), ("1001",))]


def test_a_users_own_jobs_repeating_an_app_xid_drain_nothing_another_users_do(config):
    now = [T0]
    slurm = FakePartition(NODES)
    shell = Daemon(config, slurm=slurm("node3"), clock=Clock(now=lambda: now[0]))
    for job, uid in (("201", 1000), ("202", 1000), ("203", 2000)):
        write_job_start(config.journal_dir, JobStart(job, now[0], (1,), uid=uid))
        slurm.jobs = (job,)
        shell.handle(xid13(1, now[0]))
        if job == "202":
            assert shell.actions.empty(), "one user's buggy jobs are not a bad GPU"
        (config.journal_dir / "jobs" / f"{job}.json").unlink()  # the epilog ran
        now[0] += 3600
    assert shell.actions.get_nowait().reason.startswith("healthd: xid 13 gpu1 drain-reset ")


def test_who_owns_a_gpu_when_an_xid_happens():
    starts = (JobStart("1", T0, (0, 1), 1000), JobStart("2", T0, (2,), 1001), JobStart("9", T0, (2,), 1002))
    assert engine.owner_of_gpu(1, starts, ("1", "2")) == ("1", "1000")
    assert engine.owner_of_gpu(2, starts, ("1", "2")) == ("2", "1001")  # job 9 ended without an epilog
    assert engine.owner_of_gpu(2, starts, None) is None  # Slurm silent: two notes claim GPU 2
    assert engine.owner_of_gpu(5, (), ("7",)) == ("7", "")  # no prolog notes, one job alone on the node
    assert engine.owner_of_gpu(5, (), ("7", "8")) is None


# ---- one breaker for every path that drains ----------------------------------------------------

def lost_gpu(*args, **kwargs) -> GateReport:
    finding = Finding("gpu-lost", "prolog", time.time(), gpu=1)
    return GateReport(problems=[Problem(finding, gate_verdict(finding, PolicyConfig()))])


@pytest.fixture()
def healthd_stand_in():
    """A live process whose command line names healthd, as a fresh state file's pid must."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "healthd"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_no_hook_drains_past_the_breaker(config, capsys, healthd_stand_in):
    slurm = FakePartition(NODES, drained_by_healthd=3)  # 3 of 20 already drained by healthd; the share is 10%
    assert run_prolog({"SLURM_JOB_ID": "61", "SLURM_JOB_GPUS": "1"}, slurm, config, node_check=lost_gpu) == 0
    assert run_epilog({"SLURM_JOB_ID": "61", "SLURMD_NODENAME": "node3"}, slurm, config, node_check=lost_gpu) == 0
    lost = StateFinding("gpu-lost", Action.DRAIN_REBOOT, "lost", "periodic", time.time(), gpu=1, current=True)
    write_healthd_state(config.state_dir, HealthdState(
        node="node3", pid=healthd_stand_in, policy_version="x", updated_at=time.time(),
        started="2026-11-22T00:00:00Z", nvml_ok=True, gpus=(GpuState(1, "GPU-1", "0000:2a:00", (lost,)),)))
    run_health_check({}, slurm, config)
    assert slurm.drains == []
    err = capsys.readouterr().err
    for hook in ("prolog", "epilog", "healthcheck"):
        assert f"clusterctl-{hook}: breaker open, not draining: 3 of 20 nodes in gpu already drained by healthd" in err
    assert "job 61 let in after all" in err


# ---- records root writes into shared directories -----------------------------------------------

def record(job: str = "71") -> JobHealthRecord:
    return JobHealthRecord(job_id=job, node="node3", window_start="2026-11-22T15:00:00Z",
                           window_end="2026-11-22T15:05:00Z", written_at="2026-11-22T15:05:01Z")


def test_a_per_job_directory_planted_by_a_user_is_refused(tmp_path):
    records = tmp_path / "records"
    records.mkdir(mode=0o1777)
    records.chmod(0o1777)
    (records / "71").mkdir()
    os.chown(records / "71", 65534, 65534)  # the user's own directory, there before the job ended
    with pytest.raises(UnsafePathError, match="owned by uid 65534"):
        write_job_health(records, record())
    assert list((records / "71").iterdir()) == []


def test_a_symlink_planted_at_the_per_job_directory_is_never_followed(tmp_path):
    records, target = tmp_path / "records", tmp_path / "root-only"
    records.mkdir()
    target.mkdir()
    (records / "72").symlink_to(target)
    with pytest.raises(UnsafePathError, match="not a real directory"):
        write_job_health(records, record("72"))
    assert list(target.iterdir()) == []


def test_a_symlink_at_the_record_name_is_replaced_not_written_through(tmp_path):
    records, precious = tmp_path / "records", tmp_path / "shadow"
    (records / "73").mkdir(parents=True)
    precious.write_text("root's file\n")
    (records / "73" / "node3.json").symlink_to(precious)
    write_job_health(records, record("73"))
    assert precious.read_text() == "root's file\n"
    assert read_job_health(records / "73" / "node3.json").job_id == "73"


def test_a_records_directory_anyone_can_rename_in_is_refused(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    records.chmod(0o777)
    with pytest.raises(UnsafePathError, match="without the sticky bit"):
        write_job_health(records, record())


def test_the_epilog_exits_0_when_its_record_path_is_planted_or_unwritable(config, capsys):
    config.job_records_dir.mkdir()
    (config.job_records_dir / "74").symlink_to(config.journal_dir)
    assert run_epilog({"SLURM_JOB_ID": "74", "SLURMD_NODENAME": "node3"}, FakePartition(NODES), config,
                      node_check=healthy) == 0
    blocked = replace(config, job_records_dir=config.kmsg)  # a file, not a directory
    config.kmsg.write_text("")
    assert run_epilog({"SLURM_JOB_ID": "75", "SLURMD_NODENAME": "node3"}, FakePartition(NODES), blocked,
                      node_check=healthy) == 0
    err = capsys.readouterr().err
    assert err.count("record NOT written") == 2 and "Traceback" not in err


# ---- bounded state ----------------------------------------------------------------------------

def test_a_storm_of_distinct_xids_keeps_healthd_memory_bounded():
    settings = EngineSettings(node="node3")
    storm = [Finding("xid", "kmsg", T0 + i * 1e-3, gpu=0, xid=1000 + i, value="0000:18:00") for i in range(5000)]
    state = step(EngineState(), settings, "kmsg", storm, T0 + 5).state
    assert len(state.last_seen) <= engine.MAX_DEDUP_KEYS and len(state.history) <= engine.MAX_HISTORY
    later = step(state, settings, "kmsg", [], T0 + settings.dedup_window + 10).state
    assert later.last_seen == {}  # keys past the de-dup window suppress nothing: forgotten


def test_a_starting_daemon_keeps_only_the_xid_history_that_can_still_count(config):
    config.journal_dir.mkdir(parents=True)
    for day in range(30):
        append_xid_sighting(config.journal_dir, XidSighting(T0 - day * 86400 - 10, 13, "kmsg", 1, "", ("1",)))
    Daemon(config, slurm=FakePartition(NODES)("node3"), clock=Clock(now=lambda: T0))
    assert [s.at for s in read_xid_history(config.journal_dir)] == [T0 - 10]


def test_the_kernel_log_is_read_in_batches(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("".join(f"6,{n},{n},-;line {n}\n" for n in range(1, 2001)))
    batches = KernelLog(log, "boot-a", None).follow(threading.Event())
    first = next(batches)
    assert len(first) == 2000, "one cursor write for what one read found, not one per line"


def test_an_unknown_app_xid_count_setting_is_a_clear_error():
    from clusterctl.healthd.config import ConfigError

    with pytest.raises(ConfigError, match="policy.app_xid_count` must be"):
        config_from_mapping({"policy": {"app_xid_count": "hosts"}})


def test_nonsense_or_undecodable_healthd_config_is_one_clear_error(tmp_path):
    from clusterctl.healthd.config import ConfigError, load_config

    path = tmp_path / "healthd.toml"
    for text, message in ((b"check_interval = 0\n", "`check_interval` must be a number between 1 and 3600"),
                          (b"breaker_max_share = 5\n", "`breaker_max_share` must be a number between 0 and 1"),
                          (b'node = "n\xff"\n', "not UTF-8 text"),
                          (b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "healthd.toml: ")):
        path.write_bytes(text)
        with pytest.raises(ConfigError, match=message):
            load_config(path)


def test_a_health_check_that_cannot_load_nvml_drains_nothing(config, capsys):
    slurm = FakePartition(NODES)
    assert run_health_check({}, slurm, replace(config, checks=CheckLimits(expected_gpus=8))) == 0
    assert slurm.drains == [] and "nvml-unavailable" in capsys.readouterr().err
