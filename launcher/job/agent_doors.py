"""The in-job agent's side effects: one srun step as a child process, the job's log, Slurm, signals.

Every effect the agent (`launcher/job/agent.py`) has goes through `AgentDoors`, passed in so tests
swap it; `default_doors` is the real one (`python -m clusterctl.launcher.job agent`).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.job_metrics_file import AdminSetting, read_admin_setting
from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.job.node_probe import DEFAULT_SLURMD_PORT, probe_once
from clusterctl.launcher.job.rank_stacks import StacksDoor, srun_stacks
from clusterctl.launcher.job.report_channel import ReportInbox
from clusterctl.launcher.job.signal_watch import Inbox
from clusterctl.launcher.shared.straggler_actions import StragglerDrain, srun_gpu_evidence
from clusterctl.records.gpu_evidence import GpuEvidence
from clusterctl.slurm.commands import AllocationSlurm, Slurm
from clusterctl.slurm.drains import SlurmDrains
from clusterctl.slurm.nodes import NodeState, SlurmNode, parse_nodes_json

RANKS_STEP_NAME = "clusterctl-ranks"
"""The name of every step of the job's ranks (srun --job-name: the step's, not the job's), so the agent
can end the running one by name (`AgentDoors.kill_ranks`) without knowing its step id."""
GC_THRESHOLD = (100_000, 50, 100)
"""The agent's cyclic garbage collector runs after 100,000 new objects, not Python's 700 (see
`collect_garbage_rarely`)."""


def collect_garbage_rarely() -> None:
    """Let the collector run rarely in the agent's process.  The agent holds one report per node (8
    rank records each) and remakes its watches' state once per heartbeat; what it makes holds no
    cycles, and with Python's default threshold the collector's passes over that heap took more
    than half of each feed at 100,000 ranks (bench/signals_bench.py)."""
    gc.set_threshold(*GC_THRESHOLD)
    # What is loaded by now (modules, classes, the spec) lives as long as the process: no collection
    # need look at it again (bench/signals_bench.py measures the collector's pauses).
    gc.freeze()


def read_new_log_lines(path: Path, offset: int | None) -> tuple[list[str], int]:
    """The complete lines appended to `path` since `offset` (None: none, just the current end) and the new offset."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            end = log.tell()
            if offset is None or offset > end:
                return [], end
            log.seek(offset)
            data = log.read(min(end - offset, 1 << 20))
    except OSError:
        return [], offset or 0
    complete = data[:data.rfind(b"\n") + 1]
    return complete.decode(errors="replace").splitlines(), offset + len(complete)


class Step:
    """One running srun step."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL)

    def exit_code(self) -> int | None:
        """The step's exit code once srun has exited, else None."""
        return self.process.poll()

    def stop(self, grace: float) -> int:
        """End the step: two SIGINTs within a second make srun cancel it (srun(1)); SIGKILL after `grace` s."""
        for _ in range(2):
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                time.sleep(0.2)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@dataclass
class AgentDoors:
    """Side effects, passed in so tests can swap them."""

    slurm: AllocationSlurm
    node_state: Callable[[str], NodeState]
    start_step: Callable[[Sequence[str], Mapping[str, str]], Step]
    monotonic: Callable[[], float] = time.monotonic
    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    read_log: Callable[[Path, int | None], tuple[list[str], int]] = read_new_log_lines
    say: Callable[[str], None] = field(default=lambda message: print(f"clusterctl agent: {message}",
                                                                       file=sys.stderr, flush=True))
    gpu_evidence: Callable[[str, Mapping[str, str]], GpuEvidence | str] | None = None
    """What a node's GPUs say now (healthd evidence, run there), or why that could not be read."""
    dump_stacks: StacksDoor | None = None
    """Runs the stacks command on a hung step's nodes before it is ended (None: its stacks are not kept)."""
    drain: StragglerDrain | None = None
    """The drain door for straggler verdicts (None: never drain; SlurmCommandError when Slurm refuses)."""
    node_table: Callable[[], Mapping[str, NodeState]] | None = None
    """Every node's state in one read (for steps of more than SMALL_STEP_NODES nodes; None: ask each node)."""
    open_inbox: Callable[[bytes], Inbox] = field(default=lambda key: ReportInbox(key))
    """The report inbox for the job's key (UDP on every address of the batch host, a port the kernel picks)."""
    start_standby: Callable[[Sequence[str], Mapping[str, str]], Step] | None = None
    """Starts the standby agent's step on another node (None: no standby, e.g. a test's agent)."""
    cancel_other_steps: Callable[[str], list[str]] | None = None
    """Cancels every step of the job but the caller's own (a new agent's first act); the steps cancelled."""
    wait_for_end: Callable[[], None] = field(default=lambda: _pause_until_killed())
    """What an agent that stood down does: wait, doing nothing, until the job ends (its batch script
    must not exit: that would end the job under the agent that took over)."""
    admin_metrics: Callable[[], AdminSetting] = field(default=lambda: AdminSetting())
    """The admins' textfile directory for the job's metrics (`job_metrics_dir` in the node's healthd.toml)."""
    on_terminate: Callable[[Callable[[], None]], None] = field(default=lambda cleanup: None)
    """Have `cleanup` run when the job is cancelled or its time is up (SIGTERM), before the agent dies of it."""
    kill_ranks: Callable[[str], list[str]] | None = None
    """SIGKILLs the tasks of the job's running ranks step at once (found by its name, RANKS_STEP_NAME),
    instead of Slurm's SIGTERM, KillWait (30 s by default), SIGKILL; the steps signalled."""
    probe: Callable[[str, int], tuple[bool | None, str]] | None = None
    """One probe of a node's slurmd port (launcher/job/node_probe.py; None: the agent probes nothing and
    waits for Slurm's word on a silent node)."""
    slurmd_port: Callable[[], int] = field(default=lambda: DEFAULT_SLURMD_PORT)
    """The port slurmd listens on (slurm.conf's SlurmdPort, asked once per agent)."""


def _pause_until_killed() -> None:
    while True:
        signal.pause()


def cleanup_on_sigterm(cleanup: Callable[[], None]) -> None:
    """On SIGTERM (scancel, the job's time limit: Slurm sends it to the batch script, this agent, and
    SIGKILLs KillWait seconds later), run `cleanup`, then die of the signal as without a handler: what
    Slurm and the supervisor see of the job does not change."""
    def terminated(signum: int, _frame: object) -> None:
        try:
            cleanup()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    signal.signal(signal.SIGTERM, terminated)


def default_doors(python: str = sys.executable) -> AgentDoors:
    """The real Slurm commands, srun as a child process, the system clock."""
    slurm = Slurm()

    def node_table() -> dict[str, NodeState]:
        return {n.name: n for n in parse_nodes_json(slurm.nodes_json(), release=slurm.release())}

    def cancel_other_steps(job_id: str) -> list[str]:
        own = os.environ.get("SLURM_STEP_ID", "")
        steps = [s for s in slurm.job_steps(job_id) if s.partition(".")[2].isdigit() and s.partition(".")[2] != own]
        slurm.cancel_steps(steps)
        return steps

    def kill_ranks(job_id: str) -> list[str]:
        steps = slurm.job_steps(job_id, RANKS_STEP_NAME)
        slurm.cancel_steps(steps, signal="KILL")
        return steps

    def slurmd_port() -> int:
        text = slurm.config_value("SlurmdPort")
        if text is None:
            return DEFAULT_SLURMD_PORT  # slurm.conf sets none: Slurm's own default
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise SlurmCommandError(["scontrol", "show", "config"], None, f"SlurmdPort = {text!r} is not a port")
        return int(text)

    return AgentDoors(slurm, lambda name: SlurmNode(name, slurm.runner, slurm.timeout).state(), Step,
                      gpu_evidence=srun_gpu_evidence(python), dump_stacks=srun_stacks(python),
                      drain=SlurmDrains(runner=slurm.runner, timeout=slurm.timeout).drain, node_table=node_table,
                      start_standby=Step, cancel_other_steps=cancel_other_steps, admin_metrics=read_admin_setting,
                      on_terminate=cleanup_on_sigterm, kill_ranks=kill_ranks, probe=probe_once,
                      slurmd_port=slurmd_port)
