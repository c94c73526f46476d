"""Prolog, epilog and HealthCheckProgram decisions, with a fake Slurm and recorded-format inputs.

NVML is absent in this process, so the direct check reports it (as on a node whose driver
is gone); tests that want a healthy direct check point the config at a GPU-less setup with
expected_gpus = 0 via the state file path instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.gate import GateReport, Problem, from_state, parse_job_gpus
from clusterctl.healthd.hooks import run_epilog, run_health_check, run_prolog
from clusterctl.slurm.nodes import NodeState


class FakeSlurm:
    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        self.drains: list[str] = []

    def __call__(self, node):
        return self

    def state(self):
        return NodeState("node3", "idle", ("DRAIN",) if self.reason else (), self.reason, ("gpu",))

    def drain(self, reason):
        self.drains.append(reason)
        self.reason = reason


@pytest.fixture()
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                         kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                         checks=CheckLimits(expected_gpus=0))


@pytest.fixture(scope="module", autouse=True)
def healthd_stand_in():
    """A live process whose command line names healthd, as the state file's pid must."""
    import subprocess
    import sys

    global HEALTHD_PID
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "healthd"])
    HEALTHD_PID = proc.pid
    yield proc
    proc.kill()
    proc.wait()


HEALTHD_PID = 0


def state(now: float, findings_by_gpu: dict[str, list[dict]]) -> dict:
    return {"node": "node3", "pid": HEALTHD_PID, "updated_at": now,
            "gpus": {g: {"uuid": f"GPU-{g}", "pci_bus": f"0000:{0x18 + int(g):02x}:00", "verdict": "ignore",
                         "findings": f} for g, f in findings_by_gpu.items()},
            "node_findings": []}


def write_state(config, data):
    config.state_dir.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "state.json").write_text(json.dumps(data))


def test_job_gpus_parse():
    assert parse_job_gpus("0,1,3") == [0, 1, 3] and parse_job_gpus("") is None and parse_job_gpus("x") is None


def test_unhandled_fault_blocks_only_its_gpus_and_handled_ones_do_not():
    s = state(time.time(), {"2": [{"kind": "xid 79", "action": "drain-reboot", "reason": "fell off",
                                   "handled": False}],
                            "3": [{"kind": "xid 48", "action": "drain-reset", "reason": "dbe", "handled": True}],
                            "4": [{"kind": "remap-pending", "action": "reset-at-idle", "reason": "pending"}],
                            "5": [{"kind": "xid 13", "action": "app-fault", "reason": "app"}]})
    assert [p.finding.gpu for p in from_state(s, None)] == [2, 4]
    assert from_state(s, [0, 1, 3, 5]) == []


def test_prolog_without_nvml_refuses_and_drains_with_an_owned_reason(config, capsys):
    slurm = FakeSlurm()
    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, slurm, config) == 1
    assert slurm.drains and slurm.drains[0].startswith("healthd: nvml-error ")
    err = capsys.readouterr().err
    assert "job 7 refused on node3: nvml-error" in err
    record = (config.journal_dir / "node-record.jsonl").read_text()
    assert '"hook": "prolog"' in record and '"job": "7"' in record


def test_prolog_never_relabels_an_existing_drain(config):
    slurm = FakeSlurm(reason="admin: bad fan")
    assert run_prolog({"SLURM_JOB_ID": "8"}, slurm, config) == 1
    assert slurm.drains == []


def test_epilog_names_the_node_and_gpu_that_broke_the_job(config, tmp_path):
    now = time.time()
    (config.journal_dir / "jobs").mkdir(parents=True)
    (config.journal_dir / "jobs" / "42.json").write_text(json.dumps({"start": now - 30}))
    write_state(config, state(now, {"3": [{"kind": "xid 79", "action": "drain-reboot", "reason": "fell off",
                                           "at_ts": now - 10, "handled": True, "detail": ""}],
                                    "6": [{"kind": "xid 13", "action": "app-fault", "reason": "app",
                                           "at_ts": now - 5, "detail": ""}]}))
    # An old Xid from before the job, in the kernel log, must not be blamed on it.
    boot_usec = int((time.monotonic() - 3600) * 1e6)
    config.kmsg.write_text(f"3,1,{boot_usec},-;NVRM: Xid (PCI:0000:1b:00): 48, pid=1, old\n")
    slurm = FakeSlurm()
    assert run_epilog({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node3"}, slurm, config) == 0
    record = json.loads((config.job_records_dir / "42" / "node3.json").read_text())
    kinds = {(f["kind"], f["gpu"], f["action"]) for f in record["findings"]}
    assert ("xid 79", 3, "drain-reboot") in kinds and ("xid 13", 6, "app-fault") in kinds
    assert not any(f["kind"] == "xid 48" for f in record["findings"])
    assert record["hardware_fault"] is True and record["node"] == "node3"
    assert slurm.drains and " gpu3 " in slurm.drains[0]
    assert not (config.journal_dir / "jobs" / "42.json").exists()


def test_epilog_with_an_app_fault_only_keeps_the_node(config):
    now = time.time()
    write_state(config, state(now, {"1": [{"kind": "xid 13", "action": "app-fault", "reason": "app",
                                           "at_ts": now - 1, "detail": ""}]}))
    config = replace(config, kmsg=config.kmsg.parent / "none")
    slurm = FakeSlurm()
    # With NVML absent here the direct check would blame the driver: pass a healthy node's check.
    run_epilog({"SLURM_JOB_ID": "43", "SLURMD_NODENAME": "node3"}, slurm, config,
               node_check=lambda *args, **kwargs: GateReport())
    record = json.loads((config.job_records_dir / "43" / "node3.json").read_text())
    assert record["verdict"] == "app-fault" and record["hardware_fault"] is False and slurm.drains == []


def test_health_check_answers_from_fresh_state(config, capsys):
    write_state(config, state(time.time(), {"0": []}))
    slurm = FakeSlurm()
    assert run_health_check({}, slurm, config) == 0
    assert "node3 healthy (healthd state)" in capsys.readouterr().out and slurm.drains == []
    write_state(config, state(time.time(), {"5": [{"kind": "ecc-dbe", "action": "drain-reset", "reason": "dbe"}]}))
    run_health_check({}, slurm, config)
    assert slurm.drains and slurm.drains[0].startswith("healthd: ecc-dbe gpu5 ")


def test_problem_description():
    from clusterctl.healthd.findings import Action, Finding, Verdict

    p = Problem(Finding("gpu-lost", "prolog", 0, gpu=2, detail="NVML_ERROR_GPU_IS_LOST"),
                Verdict(Action.DRAIN_REBOOT, "NVML reports the GPU lost", "gpu-lost"))
    assert p.describe() == "gpu2 gpu-lost: NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST) → drain-reboot"


def test_hooks_leave_no_half_written_record(config):
    from clusterctl.healthd.gate import write_record

    write_record(config.job_records_dir / "9", "node3.json", {"a": 1})
    assert [p.name for p in (config.job_records_dir / "9").iterdir()] == ["node3.json"]
    assert Path(config.job_records_dir / "9" / "node3.json").read_text().startswith("{")


def test_a_hook_leaves_no_alarm_armed(config):
    import signal

    run_prolog({"SLURM_JOB_ID": "10"}, FakeSlurm(), config)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_stray_cleanup_spares_the_hook_and_its_parents(monkeypatch):
    import subprocess
    import sys as _sys

    from clusterctl.healthd.hooks import _kill_strays

    env = {"SLURM_JOB_ID": "4711", "PATH": "/usr/bin:/bin"}
    runner = subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(30)"], env=env)  # like slurmd's runner
    task = subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(30)"], env={**env, "SLURM_PROCID": "0"})
    monkeypatch.setenv("SLURM_JOB_ID", "4711")  # this process is the "hook"
    try:
        time.sleep(0.2)
        _kill_strays("4711")
        assert task.wait(timeout=5) == -9
        assert runner.poll() is None
    finally:
        runner.kill()
        task.kill()


def test_a_killed_healthd_lingering_as_a_zombie_is_not_alive():
    import subprocess
    import sys

    from clusterctl.healthd.gate import healthd_alive

    proc = subprocess.Popen([sys.executable, "-c", "pass", "healthd"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "Z":  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not healthd_alive(proc.pid)
    proc.wait()
    assert healthd_alive(HEALTHD_PID)
