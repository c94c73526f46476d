"""The daemon shell with fake doors: it journals before it acts, survives restarts, writes what
the engine holds, and keeps a running config on a bad edit."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from clusterctl.clock import Clock
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.config import HealthdConfig, load_config
from clusterctl.healthd.daemon import Applied, Daemon, Observed
from clusterctl.healthd.findings import Action, Finding
from clusterctl.records.healthd_state import read_healthd_state
from clusterctl.records.healthd_xid_history import read_xid_history
from tests.conftest import import_testbed
from tests.fakes import FakePartition

T0 = 1795305600.0


@pytest.fixture()
def config(tmp_path):
    return HealthdConfig(node="node3", state_dir=tmp_path / "run", journal_dir=tmp_path / "lib", metrics="")


def daemon(config, slurm: FakePartition) -> Daemon:
    """node3's daemon in `slurm`'s partition."""
    return Daemon(config, slurm=slurm("node3"), clock=Clock(now=lambda: T0), boot_time=lambda: T0 - 3600)


LOST = Finding("gpu-lost", "nvml-event", T0, gpu=3, uuid="GPU-3")


def test_a_drain_decided_while_slurm_is_away_is_applied_once_after_a_restart(config):
    slurm = FakePartition(up=False)
    first = daemon(config, slurm)
    first.handle(Observed("nvml-event", (LOST,)))
    planned = first.actions.get_nowait()
    with pytest.raises(SlurmCommandError):
        first.apply(planned)  # slurmctld away: the decision stays pending in the journal
    second = daemon(config, slurm)  # healthd restarted
    slurm.up = True
    assert second.journal.pending() == (planned,)
    second.journal.done(planned.id, second.apply(planned).result)
    assert slurm.drains == [planned.reason]
    assert daemon(config, slurm).journal.pending() == ()


def test_the_state_file_shows_what_the_engine_holds(config):
    shell = daemon(config, FakePartition())
    shell.handle(Observed("nvml-event", (LOST,)))
    shell.write_state()
    state = read_healthd_state(config.state_dir)
    assert state is not None and state.verdict is Action.DRAIN_REBOOT
    assert [(g.index, g.verdict) for g in state.gpus] == [(3, Action.DRAIN_REBOOT)]


def test_an_app_xid_is_remembered_with_the_job_it_happened_in(config):
    shell = daemon(config, FakePartition(jobs=("4242",)))
    shell.handle(Observed("nvml-event", (Finding("xid", "nvml-event", T0, gpu=1, xid=13),)))
    assert [(s.xid, s.gpu, s.job_ids) for s in read_xid_history(config.journal_dir)] == [(13, 1, ("4242",))]


def test_a_good_config_edit_is_applied_on_reload(tmp_path):
    path = tmp_path / "healthd.toml"
    base = f'node = "node3"\nstate_dir = "{tmp_path}/run"\njournal_dir = "{tmp_path}/lib"\nmetrics = ""\n'
    path.write_text(base + "check_interval = 15\n")
    shell = Daemon(load_config(path), config_path=path, slurm=FakePartition()("node3"))
    path.write_text(base + "check_interval = 5\nresume_when_clean = true\n")
    assert shell.reload_config()
    assert shell.config.check_interval == 5 and shell.settings.resume_when_clean


def test_a_bad_config_edit_keeps_the_running_config(tmp_path):
    path = tmp_path / "healthd.toml"
    base = f'node = "node3"\nstate_dir = "{tmp_path}/run"\njournal_dir = "{tmp_path}/lib"\nmetrics = ""\n'
    path.write_text(base + "check_interval = 5\n")
    shell = Daemon(load_config(path), config_path=path, slurm=FakePartition()("node3"))
    path.write_text(base + "check_interval = 'soon'\n")
    assert not shell.reload_config()
    assert shell.config.check_interval == 5  # a bad edit never takes a running daemon down


def test_a_dry_run_daemon_changes_nothing_in_slurm(config):
    slurm = FakePartition()
    shell = daemon(replace(config, dry_run=True), slurm)
    shell.handle(Observed("nvml-event", (LOST,)))
    assert shell.apply(shell.actions.get_nowait()).result == "dry-run" and slurm.drains == []


def test_periodic_checks_ask_slurm_nothing_between_node_refreshes(config, monkeypatch):
    import threading

    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")  # no NVML: each check still runs
    slurm = FakePartition()
    shell = Daemon(replace(config, check_interval=0.1, disk_paths=(), kmsg=config.state_dir / "kmsg"),
                   slurm=slurm("node3"))
    threading.Timer(1.5, shell.stop.set).start()
    assert shell.run() == 0
    assert slurm.reads == ["node"]  # once at start; the next read is node_refresh_interval away
    state = read_healthd_state(config.state_dir)
    assert state is not None and state.slurm is not None and state.slurm.name == "node3"


def test_after_the_breaker_refused_a_fault_that_stays_is_tried_again_only_after_breaker_retry(config):
    now = [T0]
    slurm = FakePartition(drained_by_healthd=1)  # 1 of its 10 nodes drained by healthd
    shell = Daemon(replace(config, breaker_retry=600.0), slurm=slurm("node3"),
                   clock=Clock(now=lambda: now[0]), boot_time=lambda: T0 - 3600, jitter=lambda low, high: low)

    def check(*findings: Finding) -> list:
        shell.handle(Observed("periodic", findings))
        planned = []
        while not shell.actions.empty():
            action = shell.actions.get_nowait()
            shell.handle(Applied(action, shell.apply(action)))
            planned.append(action)
        return planned

    def lost(gpu: int) -> Finding:
        return Finding("gpu-lost", "periodic", now[0], gpu=gpu, uuid=f"GPU-{gpu}")

    assert len(check(lost(3))) == 1 and slurm.drains == []  # refused: 1 of 10 already drained
    assert slurm.reads == ["node", "size", "node", "share"]  # the spread's wait is 0 here (jitter: low)
    now[0] = T0 + 60
    assert check(lost(3)) == []  # the same fault, every check: the breaker is not asked again
    assert [a.reason.split()[2] for a in check(lost(3), lost(5))] == ["gpu5"]  # another fault is
    now[0] = T0 + 481  # 0.8 × breaker_retry later (the jitter's low end)
    assert [a.reason.split()[2] for a in check(lost(3), lost(5))] == ["gpu3"]
    assert slurm.reads.count("share") == 3


def test_a_drain_leaves_healthd_knowing_the_node_is_drained_without_asking_again(config):
    slurm = FakePartition()
    shell = daemon(config, slurm)
    shell.handle(Observed("nvml-event", (LOST,)))
    action = shell.actions.get_nowait()
    shell.handle(Applied(action, shell.apply(action), shell.applied_node))
    assert slurm.reads.count("node") == 2 and slurm.drains == [action.reason]
    shell.write_state()
    state = read_healthd_state(config.state_dir)
    assert state is not None and state.slurm is not None and state.slurm.drained_by_us


RUN_DAEMON = """
import os, signal, sys, threading
from pathlib import Path
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.daemon import Daemon
from tests.fakes import FakePartition

here = Path(sys.argv[1])
config = HealthdConfig(node="node3", state_dir=here / "run", journal_dir=here / "lib", kmsg=here / "kmsg",
                       boot_id=here / "boot_id", metrics="", check_interval=0.5, disk_paths=("/",))
threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
sys.exit(Daemon(config, slurm=FakePartition(21)("node3")).run())
"""


@pytest.fixture(scope="module")
def emulated_gpus(tmp_path_factory) -> Path:
    """The testbed's emulated libnvidia-ml.so.1 (eight GPUs, GPU 0 at PCI 0000:18:00, GPU 1 at 0000:2a:00)."""
    build_nvml = import_testbed("cluster").build_nvml

    lib = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    build_nvml(lib)
    return lib


def run_daemon(tmp_path, lib: Path, kmsg: str):
    import subprocess
    import sys

    (tmp_path / "boot_id").write_text("boot-a\n")
    (tmp_path / "kmsg").write_text(kmsg)
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "events").touch()
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "NVML_EMU_DIR": str(tmp_path / "gpus")}
    env.pop("NVML_EMU_ROOT", None)
    done = subprocess.run([sys.executable, "-c", RUN_DAEMON, str(tmp_path)], capture_output=True, text=True,
                          timeout=30, env=env, cwd=Path(__file__).parents[2])  # the checkout: for tests.fakes
    assert done.returncode == 0, done.stderr


def test_a_kernel_xid_goes_through_the_running_daemon_to_a_drain_and_the_state_file(tmp_path, emulated_gpus):
    from clusterctl.records.healthd_actions import read_action_journal
    from clusterctl.records.healthd_kmsg_cursor import read_kmsg_cursor

    run_daemon(tmp_path, emulated_gpus,
               "6,1,1,-;usb 1-1: new device\n3,2,2,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1, dbe\n")
    journal = read_action_journal(tmp_path / "lib" / "actions.jsonl")
    assert [(a.op, journal.results[a.id]) for a in journal.planned] == [("drain", "drained")]
    assert journal.planned[0].reason.startswith("healthd: xid 48 gpu0 ")
    state = read_healthd_state(tmp_path / "run")
    assert state is not None
    assert [(f.what, f.handled) for f in state.gpus[0].findings if f.kind == "xid"] == [("xid 48", True)]
    assert read_kmsg_cursor(tmp_path / "lib") is not None and read_kmsg_cursor(tmp_path / "lib").sequence == 2


def test_forged_kernel_lines_drain_nothing(tmp_path, emulated_gpus):
    from clusterctl.records.healthd_actions import read_action_journal
    from clusterctl.records.healthd_kmsg_cursor import read_kmsg_cursor

    forged = [
        "14,1,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, written to /dev/kmsg by a user",  # user facility
        '3,2,2,-;overlayfs: unrecognized mount option "NVRM: Xid (PCI:0000:18:00): 79, pid=1" or missing value',
        "3,3,3,-;NVRM: Xid (PCI:0000:77:00): 79, pid=1, GPU has fallen off the bus.",  # not a GPU of this node
        "3,4,4,-;NVRM: GPU at PCI:0000:77:00: GPU has fallen off the bus.",
    ]
    run_daemon(tmp_path, emulated_gpus, "".join(line + "\n" for line in forged))
    assert read_action_journal(tmp_path / "lib" / "actions.jsonl").planned == ()
    state = read_healthd_state(tmp_path / "run")
    assert state is not None and not [f for f in state.findings() if f.kind == "xid"]
    assert read_kmsg_cursor(tmp_path / "lib").sequence == 4  # read, and not acted on


def test_a_journal_from_another_healthd_version_is_set_aside_not_half_applied(config, caplog):
    path = config.journal_dir / "actions.jsonl"
    config.journal_dir.mkdir(parents=True)
    path.write_text('{"planned": {"id": "a1", "op": "drain", "reason": "healthd: x", "at": 1.0, "finding": {}}}\n')
    shell = daemon(config, FakePartition())
    assert shell.journal.pending() == ()
    [aside] = config.journal_dir.glob("actions.jsonl.unreadable-*")
    assert '"id": "a1"' in aside.read_text()
    assert "not a healthd-action record" in caplog.text and "not applied" in caplog.text


def test_a_drained_node_waits_for_its_diagnostic_which_is_journaled_and_survives_a_restart(config):
    from clusterctl.healthd.diagnostics import DiagnosticSpec, Diagnostics
    from clusterctl.records.healthd_diagnostic import DiagnosticResult, read_diagnostics

    r3 = DiagnosticSpec(("/usr/bin/dcgmi", "diag", "-r", "3", "-j"), 3600.0, "dcgmi")
    ran: list[str] = []

    def door(spec, level, timeout=None):
        ran.append(level)
        return DiagnosticResult(level, spec.name, "pass", T0 + 1, 900.0, 0, "120 results passed", "...")

    config = replace(config, resume_when_clean=True, clean_checks=1)
    slurm = FakePartition()

    def start() -> Daemon:
        return Daemon(config, slurm=slurm("node3"), clock=Clock(now=lambda: T0), boot_time=lambda: T0 - 3600,
                      diagnostic_door=door, diagnostics=lambda c: Diagnostics(before_return=r3, source="test"))

    first = start()
    first.handle(Observed("nvml-event", (Finding("ecc-dbe", "nvml-event", T0, gpu=3, uuid="GPU-3"),)))
    drain = first.actions.get_nowait()
    first.handle(Applied(drain, first.apply(drain), first.applied_node))
    first.handle(Observed("periodic", (), node=slurm("node3").state()))
    assert first.actions.empty()  # clean, but not resumed: the diagnostic is asked for
    level, spec = first.diagnostics.requests.get_nowait()
    first.handle(door(spec, level))
    assert [r.outcome for r in read_diagnostics(config.journal_dir)] == ["pass"]
    second = start()  # healthd restarted before the next check: the pass on record still counts
    second.handle(Observed("periodic", (), node=slurm("node3").state()))
    assert second.actions.get_nowait().op == "resume" and second.diagnostics.requests.empty()
    second.write_state()
    state = read_healthd_state(config.state_dir)
    assert state is not None and state.return_note.startswith("diagnostic /usr/bin/dcgmi diag -r 3 -j passed at ")
