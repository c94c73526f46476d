"""Prolog, epilog and HealthCheckProgram decisions, with a fake Slurm and recorded-format inputs.

NVML is absent in this process, so the direct check cannot judge the GPUs (as on a node whose
driver is gone); tests that want a verdict pass the hook a node check of their own.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from clusterctl.clock import utc
from clusterctl.epilog.run import run_epilog
from clusterctl.epilog.strays import kill_strays
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.engine import gate_verdict
from clusterctl.healthd.findings import Action, Finding
from clusterctl.healthd.gate import GateReport, Problem, from_state, parse_job_gpus
from clusterctl.healthd.healthcheck import run_health_check
from clusterctl.healthd.hook_common import HOOK_RESERVE
from clusterctl.healthd.policy import PolicyConfig
from clusterctl.healthd.stale_tiers import NodeTiers
from clusterctl.prolog.run import run_prolog
from clusterctl.records.healthd_job_start import JobStart, read_job_start, write_job_start
from clusterctl.records.healthd_node_record import read_node_record
from clusterctl.records.healthd_state import Alert, GpuState, HealthdState, StateFinding, write_healthd_state
from clusterctl.records.job_health import job_health_path, read_job_health
from tests.fakes import FakeNodeSlurm, FakeNodeTable, FakePartition, SlowController


NODES = 20  # node3's partition


@pytest.fixture()
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib",
                         kmsg=tmp_path / "kmsg", job_records_dir=tmp_path / "records", disk_paths=(),
                         tier_bases=(), checks=CheckLimits(expected_gpus=0))


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


def finding(kind: str, action: Action, at: float, *, xid: int | None = None, handled: bool = False,
            current: bool = False) -> StateFinding:
    return StateFinding(kind=kind, action=action, reason=f"{kind} reason", source="nvml-event", at_ts=at, xid=xid,
                        handled=handled, current=current)


def state(now: float, findings_by_gpu: dict[int, list[StateFinding]]) -> HealthdState:
    gpus = tuple(GpuState(g, f"GPU-{g}", f"0000:{0x18 + g:02x}:00", tuple(replace(f, gpu=g) for f in found))
                 for g, found in sorted(findings_by_gpu.items()))
    return HealthdState(node="node3", pid=HEALTHD_PID, policy_version="2026.11.1", updated_at=now,
                        started="2026-11-22T00:00:00Z", nvml_ok=True, gpus=gpus)


def write_state(config, data: HealthdState) -> None:
    write_healthd_state(config.state_dir, data)


def test_job_gpus_parse():
    assert parse_job_gpus("0,1,3") == [0, 1, 3] and parse_job_gpus("") is None and parse_job_gpus("x") is None


def test_unhandled_fault_blocks_only_its_gpus_and_handled_ones_do_not():
    now = time.time()
    s = state(now, {2: [finding("xid", Action.DRAIN_REBOOT, now, xid=79)],
                     3: [finding("xid", Action.DRAIN_RESET, now, xid=48, handled=True)],
                     4: [finding("remap-pending", Action.RESET_AT_IDLE, now, current=True)],
                     5: [finding("xid", Action.APP_FAULT, now, xid=13)]})
    assert [(p.finding.gpu, p.finding.what) for p in from_state(s, None)] == [(2, "xid 79"), (4, "remap-pending")]
    assert from_state(s, [0, 1, 3, 5]) == []


def lost_gpu(*args, **kwargs) -> GateReport:
    """A node check that finds GPU 1 lost."""
    finding = Finding("gpu-lost", "prolog", time.time(), gpu=1, detail="NVML_ERROR_GPU_IS_LOST")
    return GateReport(problems=[Problem(finding, gate_verdict(finding, PolicyConfig()))])


def test_prolog_refuses_a_lost_gpu_and_drains_with_an_owned_reason(config, capsys):
    slurm = FakePartition(NODES)
    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, slurm, config, node_check=lost_gpu) == 1
    assert slurm.drains and slurm.drains[0].startswith("healthd: gpu-lost gpu1 ")
    assert "job 7 refused on node3: gpu1 gpu-lost" in capsys.readouterr().err


def test_while_healthd_holds_the_breaker_open_a_prolog_lets_the_job_in_without_asking_slurm(config, capsys):
    class Unreachable(FakeNodeSlurm):  # this test's own: any read of the node fails the test
        def state(self):
            raise AssertionError("the prolog asked Slurm")

    now = time.time()
    alert = Alert(utc(now - 60), "breaker-open", "healthd: gpu-lost gpu1 drain-reboot",
                  "3 of 20 nodes in gpu already drained by healthd; draining node3 would exceed 10%")
    write_state(config, replace(state(now, {}), alerts=(alert,)))

    def unreachable(node: str) -> FakeNodeSlurm:
        return Unreachable(FakePartition(NODES), node)

    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, unreachable, config, node_check=lost_gpu) == 0
    assert "breaker open (healthd, " in capsys.readouterr().err
    slurm = FakePartition(NODES, drained_by_healthd=3)  # an hour later the partition is read again
    write_state(config, replace(state(now, {}), alerts=(replace(alert, at=utc(now - 3600)),)))
    assert run_prolog({"SLURM_JOB_ID": "8", "SLURM_JOB_GPUS": "0,1"}, slurm, config, node_check=lost_gpu) == 0
    assert slurm.drains == [] and "3 of 20 nodes in gpu" in capsys.readouterr().err


def test_a_prolog_that_cannot_load_nvml_lets_the_job_in_and_drains_nothing(config, capsys):
    # "library not found" is the same on every node at once: it cannot judge a GPU, so it drains no node.
    slurm = FakePartition(NODES)
    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, slurm, config) == 0
    assert slurm.drains == [] and read_node_record(config.journal_dir) == ()
    assert "nvml-unavailable" in capsys.readouterr().err


def test_a_refused_job_is_recorded_on_the_node(config):
    run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, FakePartition(NODES), config, node_check=lost_gpu)
    [entry] = read_node_record(config.journal_dir)
    assert (entry.hook, entry.job_id, entry.node) == ("prolog", "7", "node3")
    assert entry.outcome.startswith("drained: healthd: gpu-lost ")


def test_the_prolog_notes_when_the_job_started_for_its_epilog(config):
    before = time.time()
    run_prolog({"SLURM_JOB_ID": "11", "SLURM_JOB_GPUS": "0,1"}, FakePartition(NODES), config)
    start = read_job_start(config.journal_dir, "11")
    assert start is not None and start.gpus == (0, 1) and before <= start.start <= time.time()


def test_prolog_never_relabels_an_existing_drain(config):
    slurm = FakePartition(NODES, drained={"node3": "admin: bad fan"})
    assert run_prolog({"SLURM_JOB_ID": "8"}, slurm, config, node_check=lost_gpu) == 1
    assert slurm.drains == []


def test_epilog_names_the_node_and_gpu_that_broke_the_job(config):
    now = time.time()
    write_job_start(config.journal_dir, JobStart("42", now - 30))
    write_state(config, state(now, {3: [finding("xid", Action.DRAIN_REBOOT, now - 10, xid=79, handled=True)],
                                    6: [finding("xid", Action.APP_FAULT, now - 5, xid=13)]}))
    slurm = FakePartition(NODES)
    assert run_epilog({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node3"}, slurm, config) == 0
    record = read_job_health(job_health_path(config.job_records_dir, "42", "node3"))
    assert {(f.what, f.gpu, f.action) for f in record.findings} >= {("xid 79", 3, Action.DRAIN_REBOOT),
                                                                   ("xid 13", 6, Action.APP_FAULT)}
    assert record.hardware_fault and record.node == "node3"
    assert slurm.drains and slurm.drains[0].startswith("healthd: xid 79 gpu3 (GPU-3) drain-reboot ")


def test_epilog_does_not_blame_a_job_for_a_kernel_xid_from_before_it(config):
    now = time.time()
    write_job_start(config.journal_dir, JobStart("44", now - 30))
    boot_usec = int((time.monotonic() - 3600) * 1e6)  # logged an hour ago
    config.kmsg.write_text(f"3,1,{boot_usec},-;NVRM: Xid (PCI:0000:1b:00): 48, pid=1, old\n")
    run_epilog({"SLURM_JOB_ID": "44", "SLURMD_NODENAME": "node3"}, FakePartition(NODES), config,
               node_check=lambda *args, **kwargs: GateReport())
    record = read_job_health(job_health_path(config.job_records_dir, "44", "node3"))
    assert record.findings == ()


def test_epilog_forgets_the_job_start_once_its_record_is_written(config):
    write_job_start(config.journal_dir, JobStart("45", time.time() - 30))
    run_epilog({"SLURM_JOB_ID": "45", "SLURMD_NODENAME": "node3"}, FakePartition(NODES), config,
               node_check=lambda *args, **kwargs: GateReport())
    assert read_job_start(config.journal_dir, "45") is None


def test_epilog_with_an_app_fault_only_keeps_the_node(config):
    now = time.time()
    write_state(config, state(now, {1: [finding("xid", Action.APP_FAULT, now - 1, xid=13)]}))
    config = replace(config, kmsg=config.kmsg.parent / "none")
    slurm = FakePartition(NODES)
    # With NVML absent here the direct check would blame the driver: pass a healthy node's check.
    run_epilog({"SLURM_JOB_ID": "43", "SLURMD_NODENAME": "node3"}, slurm, config,
               node_check=lambda *args, **kwargs: GateReport())
    record = read_job_health(job_health_path(config.job_records_dir, "43", "node3"))
    assert record.verdict is Action.APP_FAULT and not record.hardware_fault and slurm.drains == []


def test_an_epilog_drain_says_the_action_it_drains_for(config):
    # The driver hung at the job's end: the gate calls that drain-reset, and so must the reason.
    def driver_hung(*args, **kwargs) -> GateReport:
        finding = Finding("nvml-hang", "prolog", time.time(), value="nvmlDeviceGetCount")
        return GateReport(problems=[Problem(finding, gate_verdict(finding, PolicyConfig()))])

    slurm = FakePartition(NODES)
    run_epilog({"SLURM_JOB_ID": "46", "SLURMD_NODENAME": "node3"}, slurm, config, node_check=driver_hung)
    assert slurm.drains and slurm.drains[0].startswith("healthd: nvml-hang drain-reset ")


def test_health_check_answers_from_fresh_state(config, capsys):
    write_state(config, state(time.time(), {0: []}))
    slurm = FakePartition(NODES)
    assert run_health_check({}, slurm, config) == 0
    assert "node3 healthy (healthd state)" in capsys.readouterr().out and slurm.drains == []


def test_health_check_drains_for_a_blocking_verdict_in_fresh_state(config):
    now = time.time()
    write_state(config, state(now, {5: [finding("ecc-dbe", Action.DRAIN_RESET, now, current=True)]}))
    slurm = FakePartition(NODES)
    run_health_check({}, slurm, config)
    assert slurm.drains and slurm.drains[0].startswith("healthd: ecc-dbe gpu5 ")


def test_a_state_from_a_newer_healthd_is_not_trusted(config, capsys):
    import json

    write_state(config, state(time.time(), {0: []}))
    path = config.state_dir / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    run_health_check({}, FakePartition(NODES), config)
    err = capsys.readouterr().err
    assert "healthd-state record version 99 is newer than this clusterctl understands" in err
    assert "checking NVML directly" in err


def test_problem_description():
    from clusterctl.healthd.findings import Action, Finding, Verdict

    p = Problem(Finding("gpu-lost", "prolog", 0, gpu=2, detail="NVML_ERROR_GPU_IS_LOST"),
                Verdict(Action.DRAIN_REBOOT, "NVML reports the GPU lost", "gpu-lost"))
    assert p.describe() == "gpu2 gpu-lost: NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST) → drain-reboot"


def test_an_epilog_interrupted_while_writing_leaves_no_record_to_half_read_and_still_exits_0(config, monkeypatch,
                                                                                          capsys):
    config = replace(config, kmsg=config.kmsg.parent / "none")

    def power_cut(fd):
        raise OSError("power cut")

    monkeypatch.setattr(os, "fsync", power_cut)
    assert run_epilog({"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "node3"}, FakePartition(NODES), config,
                      node_check=lambda *args, **kwargs: GateReport()) == 0
    monkeypatch.undo()
    assert list((config.job_records_dir / "9").iterdir()) == []
    assert "record NOT written: power cut" in capsys.readouterr().err


def test_a_hook_leaves_no_alarm_armed(config):
    import signal

    run_prolog({"SLURM_JOB_ID": "10"}, FakePartition(NODES), config)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def fake_proc(tmp_path, processes: dict[int, tuple[str, int]]) -> Path:
    """A /proc with `pid: (cgroup path, real uid)` entries; every process claims SLURM_JOB_ID=4711 in its environment."""
    proc = tmp_path / "proc"
    for pid, (cgroup, uid) in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (proc / str(pid) / "environ").write_bytes(b"SLURM_JOB_ID=4711\0SLURM_PROCID=0\0")
    return proc


def test_stray_cleanup_kills_only_the_jobs_own_tasks_by_cgroup_and_user(tmp_path):
    from clusterctl.epilog.strays import kill_strays

    proc = fake_proc(tmp_path, {
        101: ("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0", 1000),  # the job's task (v2 layout)
        102: ("/slurm/uid_1000/job_4711/step_batch", 1000),  # cgroup v1 layout
        103: ("/user.slice/user-1000.slice/session-3.scope", 1000),  # same user, outside the job: a login shell
        104: ("/system.slice/slurmstepd.scope/job_4711/step_0", 2000),  # another user's process
        105: ("/system.slice/slurmstepd.scope/job_47110/step_0", 1000),  # another job
    })
    killed: list[int] = []
    assert sorted(kill_strays("4711", 1000, proc=proc, kill=lambda pid, sig: killed.append(pid))) == [101, 102]
    assert sorted(killed) == [101, 102]
    assert kill_strays("4711", None, proc=proc, kill=lambda pid, sig: killed.append(pid)) == []  # no uid: nothing


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


# ---- a hook exits non-zero only to refuse a bad node, on purpose, through the breaker -------------

def _hook_in_a_process(tmp_path: Path, body: str, timeout: float = 60) -> tuple[int, str, float]:
    """Run a hook in its own process (its deadline ends the process): exit code, stderr, seconds taken."""
    import subprocess
    import sys

    script = tmp_path / "hook.py"
    script.write_text("import sys, time\nfrom pathlib import Path\n" + body)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent", "PYTHONPATH": str(Path(__file__).parents[2])})
    return done.returncode, done.stderr, time.monotonic() - started


_CONFIG = '''
from clusterctl.epilog.run import run_epilog
from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.config import HealthdConfig
from clusterctl.prolog.run import run_prolog
from tests.unit.test_hooks import fake_proc, lost_gpu
root = Path(sys.argv[0]).parent
config = HealthdConfig(node="node3", state_dir=root / "run", journal_dir=root / "lib", kmsg=root / "kmsg",
                       job_records_dir=root / "records", disk_paths=(), tier_bases=(),
                       checks=CheckLimits(expected_gpus=0), hook_timeout=2.0)
'''


def test_a_prolog_past_its_deadline_lets_the_job_in(tmp_path):
    """slurmd drains the node of a prolog that fails: the deadline is not a refusal."""
    code, err, _ = _hook_in_a_process(tmp_path, _CONFIG + '''
def hung(*args, **kwargs):
    time.sleep(30)
sys.exit(run_prolog({"SLURM_JOB_ID": "7"}, None, config, node_check=hung))
''')
    assert code == 0, err
    assert "gave up after 2 s" in err and "exit 0" in err


def test_the_prologs_drain_path_fits_its_budget_under_a_controller_that_does_not_answer(tmp_path):
    """Up to four Slurm calls of 10 s each once ran inside a 20 s budget: the deadline, exit 1, a drain around
    the breaker.  Each call now gets what is left of the budget."""
    code, err, took = _hook_in_a_process(tmp_path, _CONFIG + '''
from clusterctl.errors import SlurmCommandError
asked = []
def slow_controller(argv, timeout):
    asked.append(timeout)
    time.sleep(timeout)
    raise SlurmCommandError(list(argv), None, f"no answer within {timeout:g} s")
code = run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, None, config, node_check=lost_gpu,
                  runner=slow_controller)
print(f"asked {sum(asked):.2f}", file=sys.stderr)
sys.exit(code)
''')
    assert code == 0, err
    assert "could not drain" in err and "let in after all" in err and "gave up" not in err
    # What the Slurm calls were given, summed, stays inside hook_timeout (2 s): wall time is not asserted, a loaded
    # machine stretches it (seen: 6 s at a load average of 20).
    asked = float(err.rsplit("asked ", 1)[1].split()[0])
    assert asked <= 2.0, err


def test_a_hook_on_a_config_it_cannot_read_runs_with_the_defaults_and_says_so(tmp_path):
    """A FIFO (or a hung mount) at the config's path once blocked every hook until slurmd killed it."""
    fifo = tmp_path / "healthd.toml"
    os.mkfifo(fifo)
    code, err, _ = _hook_in_a_process(tmp_path, f'''
from clusterctl.epilog.run import run_epilog
from clusterctl.prolog.run import run_prolog
from tests.unit.test_hooks import lost_gpu
def healthy(*args, **kwargs):
    from clusterctl.healthd.gate import GateReport
    return GateReport(problems=[])
prolog = run_prolog({{"SLURM_JOB_ID": "7"}}, None, None, node_check=healthy, config_path=Path({str(fifo)!r}))
epilog = run_epilog({{"SLURM_JOB_ID": "7"}}, None, None, node_check=healthy, config_path=Path({str(fifo)!r}))
sys.exit(prolog * 10 + epilog)
''', timeout=40)
    assert code == 0, err
    assert err.count("CONFIG NOT USED") == 2 and "running with the defaults" in err


def test_one_bad_key_in_healthd_toml_is_dropped_alone_and_every_other_key_holds(tmp_path, capsys):
    """The admin moved the journal, turned root's tier reclaim off and mistyped two keys: the hooks drop the two
    (said with file, line and key), and keep the rest: the reclaim stays off, the journal where it was moved."""
    bad = tmp_path / "healthd.toml"
    bad.write_text(f'journal_dir = "{tmp_path / "journal"}"\nstate_dir = "{tmp_path / "run"}"\n'
                   f'job_records_dir = "{tmp_path / "records"}"\ntier_bases = []\nhook_timeout = "soon"\n'
                   'check_interval = nan\n[checks]\nexpected_gpus = 0\ngpus_expeted = 8\n')
    looked: list[int] = []

    class Tiers:
        def look(self, job_uid: int) -> NodeTiers:
            looked.append(job_uid)
            return NodeTiers((), frozenset())

    def healthy(*args, **kwargs) -> GateReport:
        return GateReport(problems=[])
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000"}
    assert run_prolog(env, FakePartition(NODES), node_check=healthy, config_path=bad, tiers=Tiers()) == 0
    assert run_epilog(env, FakePartition(NODES), node_check=healthy, config_path=bad,
                      kill_leftovers=lambda job, uid: []) == 0

    err = capsys.readouterr().err
    assert looked == [] and "CONFIG NOT USED" not in err
    for hook in ("prolog", "epilog"):
        assert (f"clusterctl-{hook}: CONFIG KEY DROPPED: {bad}:5: key `hook_timeout` must be a number between 1 and "
                "3600, found 'soon'; using its default, every other key as written") in err
        assert f"clusterctl-{hook}: CONFIG KEY DROPPED: {bad}:6: key `check_interval` must be" in err
        assert f"clusterctl-{hook}: CONFIG KEY DROPPED: {bad}:9: unknown key `checks.gpus_expeted`; known: " in err
    [record] = (tmp_path / "records" / "7").glob("*.json")  # where the admin's file says, not the default
    assert read_job_health(record).job_id == "7"


def test_a_dropped_tier_setting_turns_roots_reclaim_off_not_back_to_the_defaults(tmp_path, capsys):
    bad = tmp_path / "healthd.toml"
    bad.write_text(f'journal_dir = "{tmp_path / "journal"}"\nstate_dir = "{tmp_path / "run"}"\n'
                   'tier_bases = "/scratch/local"\n')

    class Tiers:
        def look(self, job_uid: int) -> NodeTiers:
            raise AssertionError("looked into the default tier bases")

    def healthy(*args, **kwargs) -> GateReport:
        return GateReport(problems=[])
    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000"}, FakePartition(NODES), node_check=healthy,
                      config_path=bad, tiers=Tiers()) == 0
    err = capsys.readouterr().err
    assert f"CONFIG KEY DROPPED: {bad}:3: key `tier_bases` must be a list of at most 64 absolute paths" in err
    assert "stale checkpoint tiers are not reclaimed until healthd.toml's tier settings are fixed" in err
    assert "stale checkpoint tiers not reclaimed:" not in err


# ---- the epilog under a slow or stopped controller: in budget, and the local work done first -----

JOB_TASK = "/system.slice/slurmstepd.scope/job_47/step_0/user/task_0"
EPILOG_ENV = {"SLURM_JOB_ID": "47", "SLURMD_NODENAME": "node3", "SLURM_JOB_UID": "1000", "SLURM_JOB_GPUS": "0,1"}


def test_under_a_controller_that_never_answers_the_epilog_kills_leftovers_records_and_ends_in_budget(config,
                                                                                                   tmp_path, capsys):
    """Once, the drain's Slurm calls came before the cleanup, with 10 s each: slurmd's deadline ended the
    epilog first, and the job's leftover tasks lived on."""
    config = replace(config, hook_timeout=2.0)
    write_job_start(config.journal_dir, JobStart("47", time.time() - 30))
    proc = fake_proc(tmp_path, {101: (JOB_TASK, 1000), 104: (JOB_TASK, 2000)})  # the job's task; another user's
    killed: list[int] = []
    stopped = SlowController()
    code = run_epilog(EPILOG_ENV, config=config, node_check=lost_gpu, runner=stopped, clock=stopped.clock,
                      kill_leftovers=partial(kill_strays, proc=proc, kill=lambda pid, sig: killed.append(pid)))
    err = capsys.readouterr().err
    assert code == 0 and killed == [101]
    assert "job 47: killed 1 leftover task(s): 101" in err
    assert "could not drain" in err and "no answer within 1.5 s" in err
    record = read_job_health(job_health_path(config.job_records_dir, "47", "node3"))
    assert record.hardware_fault and read_job_start(config.journal_dir, "47") is None
    assert stopped.now - stopped.start <= config.hook_timeout * (1 - HOOK_RESERVE)


@pytest.mark.parametrize("hook", [run_prolog, run_epilog])
def test_a_hooks_drain_path_under_a_slow_controller_gives_up_at_its_budget_not_slurmds(hook, config, capsys):
    """A controller answering each command in 8 s: the node, the partition's share and the drain would take
    24 s of a 20 s hook_timeout.  The calls stop at the budget's Slurm share and nothing is drained."""
    table = FakeNodeTable([f"node{i}" for i in range(1, NODES + 1)])
    slow = SlowController(table, delay=8.0)
    assert hook(EPILOG_ENV, config=config, node_check=lost_gpu, runner=slow, clock=slow.clock) == 0
    assert "could not drain" in capsys.readouterr().err
    assert table.drains == [] and len(slow.timeouts) == 2  # the node read; the share, cut short
    assert slow.now - slow.start <= config.hook_timeout * (1 - HOOK_RESERVE)


def test_health_checks_drain_under_a_slow_controller_gives_up_at_its_budget_not_slurmds(config, capsys):
    """HealthCheckProgram's drain path too: three 8 s answers would pass its 20 s, slurmd kills it at 60 s."""
    now = time.time()
    write_state(config, state(now, {5: [finding("ecc-dbe", Action.DRAIN_RESET, now, current=True)]}))
    table = FakeNodeTable([f"node{i}" for i in range(1, NODES + 1)])
    slow = SlowController(table, delay=8.0)
    assert run_health_check({}, config=config, runner=slow, clock=slow.clock) == 0
    assert "could not drain" in capsys.readouterr().err
    assert table.drains == [] and slow.now - slow.start <= config.hook_timeout * (1 - HOOK_RESERVE)


_LEFTOVER = f'''
from functools import partial
from clusterctl.epilog.strays import kill_strays
from clusterctl.records.healthd_job_start import JobStart, write_job_start
write_job_start(config.journal_dir, JobStart("47", time.time() - 30))
killed = []
leftovers = partial(kill_strays, proc=fake_proc(root, {{101: ({JOB_TASK!r}, 1000)}}),
                    kill=lambda pid, sig: killed.append(pid))
'''


def test_the_epilogs_drain_path_fits_its_budget_under_a_controller_that_does_not_answer(tmp_path):
    """The epilog's counterpart of the prolog's: each call gets what is left, so slurmd's deadline never comes."""
    code, err, took = _hook_in_a_process(tmp_path, _CONFIG + _LEFTOVER + f'''
from clusterctl.errors import SlurmCommandError
asked = []
def slow_controller(argv, timeout):
    asked.append(timeout)
    time.sleep(timeout)
    raise SlurmCommandError(list(argv), None, f"no answer within {{timeout:g}} s")
code = run_epilog({EPILOG_ENV!r}, None, config, node_check=lost_gpu, runner=slow_controller,
                  kill_leftovers=leftovers)
print(f"asked {{sum(asked):.2f}}", file=sys.stderr)
sys.exit(code + 10 * (killed != [101]))
''')
    assert code == 0, err
    assert "could not drain" in err and "gave up" not in err
    # What the Slurm calls were given, summed, stays inside hook_timeout (2 s): wall time is not asserted, a loaded
    # machine stretches it (seen: 6 s at a load average of 20).
    asked = float(err.rsplit("asked ", 1)[1].split()[0])
    assert asked <= 2.0, err
    assert job_health_path(tmp_path / "records", "47", "node3").exists()


def test_an_epilog_stuck_in_a_slurm_command_past_its_timeout_has_already_killed_and_recorded(tmp_path):
    """A client that does not return at its timeout (stuck on a hung mount or controller): slurmd's deadline
    ends the epilog in the drain, exit 0, with the leftovers killed and the record written before it."""
    code, err, took = _hook_in_a_process(tmp_path, _CONFIG + _LEFTOVER + f'''
def stuck(argv, timeout):
    if killed == [101]:
        print("leftovers killed before Slurm was asked", file=sys.stderr, flush=True)
    time.sleep(30)
run_epilog({EPILOG_ENV!r}, None, config, node_check=lost_gpu, runner=stuck, kill_leftovers=leftovers)
''')
    assert code == 0, err
    assert "leftovers killed before Slurm was asked" in err and "gave up after 2 s" in err
    assert read_job_health(job_health_path(tmp_path / "records", "47", "node3")).hardware_fault
    assert read_job_start(tmp_path / "lib", "47") is None


def test_the_hooks_load_on_a_node_whose_pynvml_is_broken():
    """A prolog that failed to import would drain every node it runs on: the hooks load NVML's bindings only
    when they ask NVML directly (and say so when they cannot), never to judge or to read healthd's state."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['pynvml'] = None\n"
            "import clusterctl.prolog.hook, clusterctl.epilog.hook, clusterctl.healthd.healthcheck\n"
            "print('loaded')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "loaded", done.stderr


def _pci(tmp_path: Path, *devices: tuple[str, str]) -> Path:
    """A sysfs PCI device tree as the kernel lays it out: one folder per device with `vendor` and `class`."""
    root = tmp_path / "pci"
    for number, (vendor, kind) in enumerate(devices):
        entry = root / f"0000:{number + 1:02x}:00.0"
        entry.mkdir(parents=True)
        (entry / "vendor").write_text(f"{vendor}\n")
        (entry / "class").write_text(f"{kind}\n")
    root.mkdir(exist_ok=True)
    return root


NVIDIA_H100 = ("0x10de", "0x030200")  # 3D controller
ETHERNET = ("0x15b3", "0x020000")
ASPEED_VGA = ("0x1a03", "0x030000")


def _without_nvml():
    from clusterctl.healthd.nvml import Nvml, NvmlError, TimedCalls

    try:
        Nvml(TimedCalls(2.0)).init()
    except NvmlError:
        return
    pytest.skip("NVML works on this host: these tests are about a node without it")


def test_a_gpu_node_without_nvml_is_not_called_healthy(config, capsys, tmp_path):
    _without_nvml()
    slurm = FakePartition(NODES)
    code = run_health_check({}, slurm, config, pci_devices=_pci(tmp_path, ETHERNET, NVIDIA_H100, NVIDIA_H100))
    out = capsys.readouterr().out
    assert code == 5 and "healthy" not in out and slurm.drains == []
    assert out.strip() == ("clusterctl-healthcheck: node3 GPUs NOT CHECKED (direct check): NVML library not found "
                           "(libnvidia-ml: is the NVIDIA driver installed?); expected here: 2 NVIDIA GPU(s) on the "
                           "PCI bus (exit 5)")


def test_a_cpu_node_without_nvml_is_healthy_and_says_its_gpus_were_not_checked(config, capsys, tmp_path):
    _without_nvml()
    code = run_health_check({}, FakePartition(NODES), config, pci_devices=_pci(tmp_path, ETHERNET, ASPEED_VGA))
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip() == ("clusterctl-healthcheck: node3 healthy (direct check; GPUs not checked: NVML library not "
                           "found (libnvidia-ml: is the NVIDIA driver installed?); none expected here: no NVIDIA GPU "
                           "on the PCI bus)")


def test_a_live_healthd_without_nvml_does_not_make_a_gpu_node_healthy(config, capsys, tmp_path):
    write_state(config, replace(state(time.time(), {}), nvml_ok=False))
    code = run_health_check({}, FakePartition(NODES), config, pci_devices=_pci(tmp_path, NVIDIA_H100))
    assert code == 5
    assert "node3 GPUs NOT CHECKED (healthd state): healthd cannot use NVML" in capsys.readouterr().out


@pytest.mark.parametrize(("setting", "code"), [("true", 5), ("false", 0), ('"auto"', 0)])
def test_healthd_check_takes_gpus_expected_from_its_config(setting, code, config, tmp_path):
    from click.testing import CliRunner

    from clusterctl.healthd.cli import cli

    _without_nvml()
    path = tmp_path / "healthd.toml"
    path.write_text(f'state_dir = "{tmp_path}/run"\njournal_dir = "{tmp_path}/lib"\ndisk_paths = []\n'
                    f"gpus_expected = {setting}\n[checks]\nexpected_gpus = 0\n")
    result = CliRunner().invoke(cli, ["check", "--config", str(path)])
    assert result.exit_code == code, result.output
    assert ("GPUs NOT CHECKED" in result.stdout) == (code == 5)
    if setting == "true":
        assert "NVML library not found" in result.stdout and "expected here: gpus_expected = true" in result.stdout


def test_healthd_check_refuses_a_gpus_expected_it_does_not_understand(tmp_path):
    from click.testing import CliRunner

    from clusterctl.healthd.cli import cli

    path = tmp_path / "healthd.toml"
    path.write_text('gpus_expected = "yes"\n')
    result = CliRunner().invoke(cli, ["check", "--config", str(path)])
    assert result.exit_code == 78
    assert 'key `gpus_expected` must be true, false or "auto", found \'yes\'' in result.output


def test_the_prolog_lets_a_gpu_job_in_on_a_node_whose_gpus_cannot_be_checked_and_says_so(config, capsys):
    _without_nvml()
    slurm = FakePartition(NODES)
    gpu_node = replace(config, gpus_expected=True)
    assert run_prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}, slurm, gpu_node) == 0
    assert run_prolog({"SLURM_JOB_ID": "8"}, slurm, config) == 0  # a CPU job on a CPU node
    err = capsys.readouterr().err
    assert slurm.drains == [] and read_node_record(config.journal_dir) == ()
    assert "clusterctl-prolog: job 7: GPUs not checked (NVML library not found" in err and "): let in" in err
