"""The in-job agent: runs a job's ranks as srun steps, hears its nodes, and recovers inside the allocation.

`python -m clusterctl.launcher.job agent` (sbatch_templates/srun.sbatch and torchrun.sbatch: every job
with a built-in template; one with spares is submitted with --no-kill) plans the rank map over the
allocation's healthy nodes, runs every rank as one srun step (torchrun style: one torchrun per node,
static rendezvous on the map's first node), and hears each node's reporter (see
docs/architecture.md, "In-job signals"): frozen ranks, healthd's drains, hangs and stragglers, and
asks Slurm only about a node a report points at (clusterctl.launcher.classify.hardware_suspects:
drained by healthd, DOWN, silent past restart.unresponsive_seconds) plus a budgeted sweep.
When a node fails it ends the step at once (ranks of the other nodes may hang in a collective
behind the dead one).  With a spare it gives the failed node back to Slurm (`scontrol update
JobId= NodeList=`: the admins see it drained, not held by a job), plans again over the remaining
nodes (a spare takes the failed node's place where the map costs least; tensor-parallel groups
stay inside a node) and starts a new step from the last complete checkpoint, without going
through the queue.  Each such restart is a `recovered-in-allocation` event in the run's journal,
with its evidence and timings.

What follows a step is not decided here: the agent gathers what happened (the step's exit code,
the nodes that failed under it, hung ranks, what the program asked for with its exit code, the last
checkpoint, the run's restart budget replayed from the journal) and asks `recovery.judge`, the
function the supervisor asks too.  It exits with the step's exit code when the judge leaves the
attempt to the supervisor: the program's own failure, no spare left (the failed node stays in the
job, so the supervisor blames it and resubmits without it), a failed batch host (the agent runs
there: losing it ends the job, and the supervisor's resubmission is the fallback), or the run's
restart budget spent.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.errors import PlacementError, SlurmCommandError
from clusterctl.launcher.pure.checkpoint import Checkpoint
from clusterctl.launcher.shared.checkpoints import resume_point
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.pure.checkpoint_tiers import nodes_for_map, resumed_text
from clusterctl.records.checkpoint_holdings import CheckpointHoldings
from clusterctl.launcher.job.report_channel import ReportInbox
from clusterctl.launcher.job.signal_watch import Inbox, SignalWatch
from clusterctl.launcher.pure.classify import (
    NODE_FAILURE, Blame, Outcome, hardware_suspects, not_responding, operator_drains, step_outcome,
)
from clusterctl.launcher.pure.hang_watch import HangPolicy, HangVerdict, HangWatch, progress_from_log_line
from clusterctl.launcher.pure.node_signals import SMALL_STEP_NODES, SignalPolicy, Signals, slurm_sweep_seconds
from clusterctl.launcher.pure.recovery import Act, Allocation, Happened, Recovery, RestartBudget, judge
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.launcher.shared.straggler_actions import (
    StragglerActions, StragglerDoors, StragglerDrain, srun_gpu_evidence,
)
from clusterctl.launcher.pure.straggler_watch import Straggler, StragglerWatch
from clusterctl.launcher.pure.takeover import Takeover
from clusterctl.records.agent_lease import AgentLease, current_lease, take_lease
from clusterctl.records.agent_summary import AgentSummary, write_agent_summary
from clusterctl.launcher.pure.job_metrics_text import job_metrics_text
from clusterctl.job_metrics_file import (
    AdminSetting, destination, directory_problem, read_admin_setting, remove_textfile, textfile_name, write_textfile,
)
from clusterctl.records.training_series import SERIES_NAME, append_training_point, point_of
from clusterctl.records.gpu_evidence import GpuEvidence
from clusterctl.records.node_report import REPORT_ADDR_ENV, REPORT_INTERVAL_ENV, REPORT_KEY_ENV, REPORT_LAUNCH_ENV
from clusterctl.records.rank_map import RankMap
from clusterctl.records.run_journal import (
    OutcomeKind, RecoveredInAllocation, append_run_event, read_run_journal,
)
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import AllocationSlurm, Slurm
from clusterctl.slurm.drains import SlurmDrains
from clusterctl.slurm.nodes import NodeState, SlurmNode, parse_nodes_json

STEP_POLL_SECONDS = 0.2
"""How often the agent looks whether the step ended (a local waitpid, free)."""


STOP_GRACE_SECONDS = 15.0
"""How long an interrupted step may take to end before srun is killed."""
EVIDENCE_GRACE_SECONDS = 5.0
"""After a step failed with no node to blame yet: how long healthd's drain may take to show in Slurm."""
HINT_BACKOFF_MAX_SECONDS = 30.0
"""A node a report points at (healthd says drain, gone silent) is asked about at once, then at most
after 1, 2, 4, ... up to this many seconds while the hint lasts."""
SUMMARY_MIN_SECONDS = 2.0
"""The agent summary (`<job dir>/agent-summary.json`) is rewritten every max(this, heartbeat) s."""
SERIES_MIN_SECONDS = 10.0
"""The job's training series gets a point at most this often while the step runs (and at each state change)."""


GC_THRESHOLD = (100_000, 50, 100)
"""The agent's cyclic garbage collector runs after 100,000 new objects, not Python's 700 (see
`collect_garbage_rarely`)."""


def collect_garbage_rarely() -> None:
    """Let the collector run rarely in the agent's process.  The agent holds one report per node (8
    rank records each) and remakes its watches' state once per heartbeat; what it makes holds no
    cycles, and with Python's default threshold the collector's passes over that heap took more
    than half of each feed at 100,000 ranks (bench/signals_bench.py)."""
    gc.set_threshold(*GC_THRESHOLD)


# ---- pure: what the agent computes ----------------------------------------------------------------

def resized_environment(environ: Mapping[str, str], nodes: Sequence[str]) -> dict[str, str]:
    """The job's environment as after a resize to `nodes` (what Slurm's resize script would set),
    so srun asks for a step on the nodes the job still has."""
    env = dict(environ)
    names = hostlist.compress(list(nodes))
    for key in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        env[key] = names
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        env[key] = str(len(nodes))
    for key in ("SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = env.get(key, "")
        per_node = value.split("(", 1)[0]
        if per_node.isdigit() and all(part.split("(", 1)[0] == per_node for part in value.split(",")):
            env[key] = f"{per_node}(x{len(nodes)})" if len(nodes) > 1 else per_node
    return env


def step_argv(spec: JobSpec, python: str, job_dir: Path, command: Sequence[str]) -> tuple[list[str], str]:
    """srun's argv for one step of the job's ranks, and the SLURM_HOSTFILE it places them with.

    srun style: one task per GPU (`job rank`, placed by the per-GPU hostfile); torchrun style: one
    task per node (`job node`, placed by the node file), each becoming torchrun with the map's node
    rank and the map's first node as its rendezvous host, so a step planned without a failed node
    has its own rendezvous host whichever node failed."""
    # --overlap: a step ended because a node died stays "completing" at slurmctld until that node is
    # declared DOWN; without it the new step waits ("Requested nodes are busy") for the dead node.
    if spec.launch.style == "torchrun":
        tasks, wrapper, hostfile = spec.job.nodes, "node", job_dir / "nodefile"
    else:
        tasks, wrapper, hostfile = spec.world_size, "rank", job_dir / "hostfile"
    argv = ["srun", "--distribution=arbitrary", f"--ntasks={tasks}", "--kill-on-bad-exit=1", "--overlap",
            python, "-m", "clusterctl.launcher.job", wrapper, "--job-dir", str(job_dir), "--", *command]
    return argv, str(hostfile)


@dataclass(frozen=True)
class Launched:
    """A running step: its srun, its job directory and rank map, when it started (epoch s), where the log was."""

    step: Step
    job_dir: Path
    rank_map: RankMap
    started_at: float
    log_offset: int = 0
    signals: SignalWatch | None = None
    """The step's node reports (None: a test's step without a report channel)."""
    launch: str = "0"

    @property
    def slots(self) -> tuple[str, ...]:
        """The step's nodes, in rank-map order."""
        return self.rank_map.slots


@dataclass(frozen=True)
class Watched:
    """How watching a step ended: its exit code (None: ended for `suspects` or a hang), when it was seen."""

    exit_code: int | None
    suspects: list[Blame]
    seen: float
    hang: HangVerdict | None = None
    straggler: Straggler | None = None
    lost_s: float = 0.0
    """Time the step's stragglers cost it (the slowest rank's excess per step, summed)."""


# ---- the doors it is given -----------------------------------------------------------------------


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


class StoodDown(Exception):
    """Another agent holds a higher epoch of the job's lease: this one must not act again."""


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

    return AgentDoors(slurm, lambda name: SlurmNode(name, slurm.runner, slurm.timeout).state(), Step,
                      gpu_evidence=srun_gpu_evidence(python),
                      drain=SlurmDrains(runner=slurm.runner, timeout=slurm.timeout).drain, node_table=node_table,
                      start_standby=Step, cancel_other_steps=cancel_other_steps, admin_metrics=read_admin_setting,
                      on_terminate=cleanup_on_sigterm)


# ---- the loop --------------------------------------------------------------------------------------

class Agent:
    """One job's in-allocation agent."""

    def __init__(self, run_dir: Path, job_dir: Path, spec: JobSpec, environ: Mapping[str, str], doors: AgentDoors,
                 *, python: str = sys.executable, epoch: int = 1) -> None:
        self.run_dir, self.job_dir, self.spec, self.environ, self.doors = run_dir, job_dir, spec, environ, doors
        self.metrics_dir: Path | None = None
        """Where the job's metrics file goes (node_exporter's textfile directory; None: nowhere)."""
        self.metrics_export_failed = False
        self.metrics_written = False
        self.series_failed = False
        self.series_at = float("-inf")
        """When the last point was appended (the summary's time)."""
        self.series_last: tuple[str, int] | None = None
        """(launch, step) of the last point appended to the job's training series."""
        self.python = python
        self.job_id = environ["SLURM_JOB_ID"]
        self.allocated = tuple(hostlist.expand(environ["SLURM_JOB_NODELIST"]))
        self.log_path = run_dir / "logs" / f"{self.job_id}.out"  # sbatch --output: the agent's own stdout
        # Slurm runs the batch script (this agent) on the allocation's first node; an agent that took
        # over runs on its standby's node.  Either way, the node this agent runs on: never given back.
        self.batch_host = environ.get("SLURMD_NODENAME") or self.allocated[0]
        self.epoch = epoch
        self.leased = False
        self.took_over_from = ""
        self.out_of_job: frozenset[str] = frozenset()
        """Blamed nodes Slurm already took out of the job (a dead batch host): nothing to give back."""
        self.standby: tuple[str, Step] | None = None
        self.ended: tuple[Outcome, Recovery] | None = None
        """How the last step ended and what the judge said (for an agent that must end the job itself)."""

    def _states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        states = {}
        for name in nodes:
            try:
                states[name] = self.doors.node_state(name)
            except SlurmCommandError as exc:
                self.doors.say(f"cannot read {name} from Slurm ({exc}); judging without it")
        return states

    def _hang_policy(self, signals: SignalPolicy) -> HangPolicy:
        """The spec's hang timeouts, widened to what the report channel can tell apart: a node's
        records reach the agent up to a heartbeat late (two when a datagram is lost), so healthy
        ranks' reports differ by that much, and a node is only silent after `silent_after`."""
        r = self.spec.restart
        lag = 2 * signals.heartbeat + 1.0
        floor = max(r.hang_min_step_seconds, signals.silent_after)
        return HangPolicy(startup_timeout=r.hang_startup_seconds, checkpoint_timeout=r.hang_checkpoint_seconds,
                          safety_factor=r.hang_safety_factor, min_step_timeout=floor,
                          max_step_timeout=max(1800.0, floor), straggler_gap=max(HangPolicy.straggler_gap, lag),
                          liveness_gap=max(HangPolicy.liveness_gap, lag))

    def _watch(self, launched: Launched, spares: int) -> Watched:
        """Wait for the step to end, for one of its nodes to fail, for its ranks to hang, or for a
        straggler to swap (`spares`: nodes of the allocation beyond the job's, left to swap in).

        The node reports (launcher/job/signal_watch.py) are taken every STEP_POLL_SECONDS: a node
        whose ranks froze ends the step at once; a node healthd says it drained, or that went
        silent, is asked about in Slurm (one single-node query, then backing off while the hint
        lasts).  What no report carries (an operator's drain, a node Slurm declared DOWN) comes
        from a sweep of the step's nodes in Slurm every `slurm_sweep_seconds`.  The hang and
        straggler watches take every rank's newest record once per heartbeat."""
        nodes = launched.slots
        stragglers = StragglerWatch.start(self.spec.stragglers, launched.started_at)
        silent_since: dict[str, float] = {}
        grace = self.spec.restart.unresponsive_seconds
        watch = launched.signals
        heartbeat = watch.policy.heartbeat if watch else 1.0
        sweep_every = slurm_sweep_seconds(len(nodes))
        next_sweep = next_judge = next_summary = self.doors.monotonic()
        hints: dict[str, tuple[float, float]] = {}  # node -> (when it may be asked again, the back-off)
        rank_map = launched.rank_map
        hangs = HangWatch.start(self._hang_policy(watch.policy if watch else SignalPolicy()), launched.started_at,
                                {r: rank_map.location(r)[0] for r in range(rank_map.world_size)})
        pattern = self.spec.restart.progress_pattern
        log_offset = launched.log_offset
        signals = Signals()

        def frozen_now() -> Watched | None:
            """Take the reports waiting now; a Watched when they say a node's ranks froze."""
            nonlocal signals
            if watch is None:
                return None
            signals = watch.poll()
            if signals.frozen is None:
                return None
            return Watched(None, list(signals.frozen.blames()), self.doors.monotonic(), signals.frozen,
                           lost_s=stragglers.lost_s)

        while True:
            code = launched.step.exit_code()
            if code is not None:
                return Watched(code, [], self.doors.monotonic(), lost_s=stragglers.lost_s)
            if (frozen := frozen_now()) is not None:
                return frozen
            now = self.doors.monotonic()
            hinted = [n for n in (*signals.drained, *signals.silent) if hints.get(n, (0.0, 0.0))[0] <= now]
            for name in [n for n in hints if n not in signals.drained and n not in signals.silent]:
                del hints[name]  # the hint is over: a new one is asked about at once
            sweep = now >= next_sweep
            if now >= next_summary and watch is not None:
                next_summary = now + max(SUMMARY_MIN_SECONDS, heartbeat)
                self._summarize(launched, watch, signals, stragglers=stragglers)
                if self.tiers is not None:
                    self.tiers.record_due()
            if not hinted and not sweep and now < next_judge:
                self.doors.sleep(STEP_POLL_SECONDS)
                continue
            if hinted or sweep:
                states = self._look_in_slurm(nodes, hinted, sweep)
                if sweep:
                    next_sweep = now + sweep_every
                for name in hinted:
                    backoff = min(HINT_BACKOFF_MAX_SECONDS, max(1.0, 2 * hints.get(name, (0.0, 0.5))[1]))
                    hints[name] = (now + backoff, backoff)
                now = self.doors.monotonic()
                for name, state in states.items():
                    if not_responding(state):
                        silent_since.setdefault(name, now)
                    else:
                        silent_since.pop(name, None)
                suspects = hardware_suspects(nodes, states, {n: now - t for n, t in silent_since.items()}, grace)
                if not suspects and spares >= 1:  # an operator wants the node back: a spare takes its place
                    suspects = [b for b in operator_drains(nodes, states) if b.node != self.batch_host]
                if suspects:
                    return Watched(None, suspects, now, lost_s=stragglers.lost_s)
            if now < next_judge:
                continue
            next_judge = now + heartbeat
            if self.tiers is not None and self.tiers.resuming is not None and watch is not None:
                self._journal_resume(watch.holdings())
            records = watch.records() if watch is not None else ()
            # At 100,000 ranks each part of this feed takes a few tenths of a second: the reports are
            # taken between the parts, so frozen ranks are not kept waiting for the whole feed.
            hangs = hangs.observe(records)
            if (frozen := frozen_now()) is not None:
                return frozen
            if self.spec.stragglers.action != "off":
                stragglers = stragglers.observe(records)
                if (frozen := frozen_now()) is not None:
                    return frozen
                self.straggler_actions.write_table(stragglers)
                for found in stragglers.found:
                    no_swap = (f"{found.node} is the batch host, where this agent runs" if found.node == self.batch_host
                               else "no spare left" if spares < 1 else "")
                    env = resized_environment(self.environ, launched.slots)
                    swap = self.straggler_actions.act(found, env, no_swap=no_swap)
                    if swap is not None:
                        return Watched(None, [swap], now, straggler=found, lost_s=stragglers.lost_s)
            if pattern:
                lines, log_offset = self.doors.read_log(self.log_path, log_offset)
                for line in lines:
                    logged = progress_from_log_line(line, pattern)
                    if logged is not None:
                        hangs = hangs.observe_log_step(logged, self.doors.now())
            if hangs.latest or hangs.logged is not None:  # the program reports progress: judge it
                verdict = hangs.verdict(self.doors.now())
                if verdict.hung:
                    return Watched(None, list(verdict.blames()), now, verdict, lost_s=stragglers.lost_s)

    def _look_in_slurm(self, nodes: Sequence[str], hinted: Sequence[str], sweep: bool) -> dict[str, NodeState]:
        """The states of the `hinted` nodes (one single-node query each), and on a `sweep` of every
        node of the step: one query each up to SMALL_STEP_NODES nodes, else one node-table read."""
        states: dict[str, NodeState] = {}
        if sweep and len(nodes) > SMALL_STEP_NODES and self.doors.node_table is not None:
            try:
                table = self.doors.node_table()
                states.update({n: table[n] for n in nodes if n in table})
            except SlurmCommandError as exc:
                self.doors.say(f"cannot read the node table ({exc}); judging without it")
        elif sweep:
            states.update(self._states(nodes))
        states.update(self._states([n for n in hinted if n not in states]))
        return states

    def _summarize(self, launched: Launched, watch: SignalWatch, signals: Signals, state: str = "watching",
                   stragglers: StragglerWatch | None = None) -> None:
        """Rewrite the agent summary the supervisor and `clusterctl status` read (one file per interval), and
        append to the job's training series when the step moved (`stragglers`: the slowest node's step time)."""
        if self.tiers is not None:
            self.tiers.observe(watch.holdings())
        steps = [r.step for r in watch.records()]
        stopped = tuple(sorted({h.report.node for h in watch.signals.heard.values()
                                for b in h.report.ranks if b.process in ("stopped", "gone")}))
        refused = dict(watch.inbox.refused)
        training = watch.training(launched.rank_map.world_size, self.spec.job.gpu_peak_tflops)
        summary = AgentSummary(
            job_id=self.job_id, launch=launched.launch, at=self.doors.now(),
            interval=max(SUMMARY_MIN_SECONDS, watch.policy.heartbeat), state=state,
            nodes=len(launched.slots), reporting=signals.reporting, silent=signals.silent, stopped=stopped,
            drained=signals.drained, min_step=min(steps) if steps else None,
            max_step=max(steps) if steps else None, refused=refused,
            message=(f"{signals.channel_silent} nodes silent at once: the report channel, not the nodes"
                     if signals.channel_silent else ""), training=training)
        try:
            write_agent_summary(self.job_dir, summary)
        except OSError as exc:
            self.doors.say(f"cannot write the agent summary in {self.job_dir} ({exc.strerror}); watching on")
        self._append_training(summary, stragglers)
        self._export_metrics(summary)
        self._check_in_charge()

    def _choose_metrics_dir(self) -> None:
        """Where the job's metrics file goes (clusterctl/job_metrics_file.py: the job's environment, else
        the admins' healthd.toml): said in one line, or why not; the job goes on either way."""
        chosen = destination(self.environ, self.doors.admin_metrics())
        self.metrics_dir = None
        if chosen.problem:
            self.doors.say(chosen.problem)
        if chosen.directory is None:
            return
        problem = directory_problem(chosen.directory)
        if problem is not None:
            self.doors.say(f"{chosen.source} names {chosen.directory}, which {problem}: the job's metrics are not "
                           "exported")
            return
        self.metrics_dir = chosen.directory
        self.doors.say(f"the job's metrics go to {chosen.directory / textfile_name(self.job_id)} (from "
                       f"{chosen.source}) while this agent runs")
        self.doors.on_terminate(self._withdraw_metrics)

    def _append_training(self, summary: AgentSummary, stragglers: StragglerWatch | None) -> None:
        """One point of the job's training series (`<job dir>/training-series.jsonl`), when the summary has
        training figures and the step moved since the last point; a failure is said once, the job goes on."""
        if summary.training is None or summary.max_step is None or \
                (summary.launch, summary.max_step) == self.series_last:
            return
        if summary.state == "watching" and summary.at - self.series_at < SERIES_MIN_SECONDS:
            return  # a small job's 2 s summaries: its rates are 30 s averages, a point each 10 s loses nothing
        slowest = stragglers.slowest if stragglers is not None else None
        point = point_of(summary, (slowest.node, slowest.seconds) if slowest and slowest.seconds is not None else None,
                         stragglers.reference if stragglers is not None else None)
        if point is None:
            return
        try:
            append_training_point(self.job_dir, point)
        except OSError as exc:
            if not self.series_failed:
                self.doors.say(f"cannot append the job's training series to {self.job_dir / SERIES_NAME} "
                               f"({exc.strerror}): `report --html` will draw its curves with gaps; watching on")
            self.series_failed = True
            return
        self.series_last = (summary.launch, summary.max_step)
        self.series_at = summary.at

    def _export_metrics(self, summary: AgentSummary) -> None:
        """The summary's figures as a node_exporter textfile (launcher/pure/job_metrics_text.py), when a
        directory was chosen; a failure is said once, the job goes on."""
        if self.metrics_dir is None:
            return
        try:
            self.metrics_written = True  # a write cut short may leave its temp file: withdrawn too
            write_textfile(self.metrics_dir, self.job_id, job_metrics_text(summary, self.spec.job.name))
        except OSError as exc:
            if not self.metrics_export_failed:
                self.doors.say(f"cannot write the job's metrics to {self.metrics_dir / textfile_name(self.job_id)} "
                               f"({exc.strerror}): watching on without them")
            self.metrics_export_failed = True

    def _withdraw_metrics(self) -> None:
        """Remove the job's metrics file: once the agent is gone nobody updates it, and node_exporter
        would export its last figures for ever (the epilog removes it too, for an agent killed hard)."""
        if self.metrics_dir is None or not self.metrics_written:
            return
        try:
            remove_textfile(self.metrics_dir, self.job_id)
        except OSError as exc:
            self.doors.say(f"cannot remove the job's metrics file from {self.metrics_dir} ({exc.strerror})")

    def _evidence_after(self, nodes: Sequence[str]) -> list[Blame]:
        """The step failed by itself: healthd's drain (or Slurm's DOWN) may show a moment later."""
        deadline = self.doors.monotonic() + EVIDENCE_GRACE_SECONDS
        while True:
            states = self._states(nodes)
            suspects = hardware_suspects(nodes, states, {n: float("inf") for n, s in states.items()
                                                         if not_responding(s)}, 0.0)
            if suspects or self.doors.monotonic() >= deadline:
                return suspects
            self.doors.sleep(0.5)

    def _launch(self, job_dir: Path, nodes: Sequence[str], resume_from: str | None, restart: int = 0) -> Launched:
        from clusterctl.launcher.job.steps import plan_for_job
        from clusterctl.launcher.pure.render import launch_command
        env = resized_environment(self.environ, nodes)
        rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm)
        if self.tiers is not None:
            holders = self.tiers.holders()
            chosen = nodes_for_map(nodes, rank_map.rank_map.slots, holders)
            if chosen is not None:
                # Seen on the testbed: a resubmitted job's map left the node holding the checkpoint's copies
                # as its spare (best fit took the fuller leaf), where no copy server runs to give them.
                spare = [n for n in nodes if n not in chosen]
                self.doors.say(f"the map keeps {' '.join(sorted(holders & set(nodes)))} (they hold the copies the "
                               f"resume reads); spare: {' '.join(spare)}")
                try:
                    rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm, candidates=chosen)
                except (PlacementError, ValueError) as exc:  # the first map stands: a slower resume, not none
                    self.doors.say(f"cannot make the map of {' '.join(chosen)} ({exc}); keeping the first")
                    rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm)
            if not holders <= set(rank_map.rank_map.slots):
                self.tiers.resume_point(rank_map.rank_map.slots)  # a copy off the map cannot be fetched
            # The program resumes through clusterctl.checkpoint, which reads the step's tier index.
            leaf_of = {str(n.get("node")): str(n.get("leaf")) for n in rank_map.plan.get("nodes", ())
                       if isinstance(n, Mapping)}
            env.update(self.tiers.launch_env(job_dir, rank_map.rank_map.slots, leaf_of, rank_map.master_port))
            env.pop(self.spec.checkpoint.resume_env, None)  # the batch script's, from the supervisor's choice
            resume_from = None
        if resume_from:
            env[self.spec.checkpoint.resume_env] = resume_from
        command = launch_command(self.spec, str(self.run_dir), resume_from)
        argv, env["SLURM_HOSTFILE"] = step_argv(self.spec, self.python, job_dir, command)
        launch = str(self.launches)
        self.launches += 1
        policy = SignalPolicy.for_nodes(len(rank_map.rank_map.slots))
        if self.inbox is not None:
            env.update({REPORT_KEY_ENV: self.report_key.hex(),
                        REPORT_ADDR_ENV: f"{self.batch_host}:{self.inbox.port}",
                        REPORT_LAUNCH_ENV: launch, REPORT_INTERVAL_ENV: f"{policy.heartbeat:g}"})
        offset = self.doors.read_log(self.log_path, None)[1]  # where this step's lines begin
        started_at = self.doors.now()
        step = self.doors.start_step(argv, env)
        if self.tiers is not None:
            self.tiers.step_started(restart, started_at)
        watch = SignalWatch(self.inbox, self.job_id, launch, rank_map.rank_map.slots, policy, started_at,
                            self.doors.now) if self.inbox is not None else None
        return Launched(step, job_dir, rank_map.rank_map, started_at, offset, watch, launch)

    def _prepare(self) -> None:
        """What every agent needs before its first step: straggler doors, budget, report key and inbox."""
        doors = self.doors
        self.straggler_actions = StragglerActions(
            self.run_dir, self.job_dir, self.job_id, self.spec.stragglers.action, self.spec.restart.blame_hours,
            StragglerDoors(doors.now, doors.say, doors.gpu_evidence, doors.drain))
        self.budget = self._budget(RestartBudget())
        # The job's report key: in the step's environment only, so a datagram from anyone else
        # (another user's process on a shared node, a forged packet) is refused unread.
        self.report_key = secrets.token_bytes(32)
        self.inbox: Inbox | None = None
        try:
            self.inbox = doors.open_inbox(self.report_key)
        except OSError as exc:
            doors.say(f"cannot open the report inbox ({exc.strerror}): watching the nodes through Slurm only "
                      f"(every {slurm_sweep_seconds(len(self.allocated)):g} s), with no hang or straggler watch")
        self.launches = 0
        self._choose_metrics_dir()
        self.tiers: TierPlanner | None = None
        if self.spec.checkpoint.tiers:
            self.tiers = TierPlanner(self.run_dir, self.job_dir, self.spec, self.environ, doors.say, doors.monotonic)
            self.tiers.load_previous()

    def _lead(self, why: str = "") -> None:
        """Take this agent's epoch of the job's lease (StoodDown when another agent holds it)."""
        try:
            taken = take_lease(self.job_dir, AgentLease(self.epoch, self.batch_host, os.getpid(), self.doors.now(),
                                                        why=why))
        except OSError as exc:
            self.doors.say(f"cannot take the job's lease in {self.job_dir} ({exc.strerror}): no standby agent for "
                           "this job")
            return
        if not taken:
            raise StoodDown(f"epoch {self.epoch} of the job's lease is held by another agent")
        self.leased = True

    def _check_in_charge(self) -> None:
        """StoodDown when a standby took the job over (a higher epoch than this agent's)."""
        if not self.leased:
            return
        try:
            lease = current_lease(self.job_dir)
        except (OSError, RecordError) as exc:
            self.doors.say(f"cannot read the job's lease ({exc}); acting on (Slurm fences a dead node's agent)")
            return
        if lease is not None and lease.epoch > self.epoch:
            raise StoodDown(f"the agent on {lease.node} took the job over (epoch {lease.epoch}): {lease.why}")

    def run(self, resume_from: str | None) -> int:
        """Steps until one completes, fails on its own, or the judge sends the job back to the supervisor
        (no spare left, the batch host failed, the restart budget spent); the job's exit code."""
        self._prepare()
        try:
            self._lead()
            if self.tiers is not None:
                first = self._checkpoint(present=self.allocated)
                resume_from = first.path if first else None
            launched = self._launch(self.job_dir, self.allocated, resume_from)
            self._keep_standby(launched, self.allocated, resume_from)
            return self._drive(launched, self.allocated, resume_from, 0)
        except StoodDown as exc:
            self._withdraw_metrics()  # the agent in charge writes its own, on its node
            self.doors.say(f"standing down: {exc}; waiting for the job to end")
            self.doors.wait_for_end()
            return 0
        finally:
            self._withdraw_metrics()

    def take_over(self, taken: Takeover, in_use: Sequence[str], resume_from: str | None) -> int | None:
        """Carry on the job whose agent (on its batch host, `taken.node`) is gone: take the next epoch of
        the lease, cancel the steps the old agent left, and recover as from any node failure (`in_use`:
        the nodes of its last step and the job's spares, the dead host among them).  The job's exit
        code; None when another agent took this epoch first (this one then does nothing)."""
        self._prepare()
        try:
            return self._carry_on(taken, in_use, resume_from)
        finally:
            self._withdraw_metrics()

    def _carry_on(self, taken: Takeover, in_use: Sequence[str], resume_from: str | None) -> int | None:
        self.took_over_from = taken.node
        self.out_of_job = frozenset({taken.node}) if taken.left_job else frozenset()
        try:
            self._lead(why="; ".join(taken.evidence))
        except StoodDown as exc:
            self.doors.say(f"not taking over: {exc}")
            return None
        seen = self.doors.monotonic()
        self.doors.say(f"taking the job over from {taken.node} (epoch {self.epoch}): {'; '.join(taken.evidence)}")
        if self.doors.cancel_other_steps is not None:
            try:
                stray = self.doors.cancel_other_steps(self.job_id)
                if stray:
                    self.doors.say(f"cancelled the old agent's steps {' '.join(stray)}")
            except SlurmCommandError as exc:
                self.doors.say(f"could not cancel the old agent's steps ({exc}); starting the next one all the same")
        ended = self.doors.monotonic()
        blame = Blame(taken.node, "the batch host died with the job's agent", taken.evidence)
        outcome = Outcome(NODE_FAILURE, f"the batch host {taken.node} died", (blame,))
        checkpoint = self._checkpoint([n for n in in_use if n != taken.node])
        self.budget = self._budget(self.budget)
        decision = judge(Happened(outcome, checkpoint.step if checkpoint else None,
                                  Allocation(tuple(in_use), self._needed(in_use), self.batch_host)),
                         self.budget, self.spec.restart)
        self.ended = (outcome, decision)
        self.doors.say(decision.message)
        if not decision.act.in_allocation:
            return 1
        restart = self._next_restart()
        try:
            launched = self._restart(decision, restart, checkpoint, resume_from, seen, ended)
            resume_from = checkpoint.path if checkpoint else resume_from
            self.budget = decision.budget
            self._keep_standby(launched, decision.nodes, resume_from)
            return self._drive(launched, decision.nodes, resume_from, restart)
        except StoodDown as exc:
            self.doors.say(f"standing down: {exc}")
            return None

    def _next_restart(self) -> int:
        """The number of the next restart inside this job (after the old agent's, which the journal holds)."""
        try:
            done = [e.restart for e in read_run_journal(self.run_dir / "journal.jsonl").events
                    if isinstance(e, RecoveredInAllocation) and e.job_id == self.job_id]
        except (OSError, RecordError):
            done = []
        restart = max(done, default=0) + 1
        while (self.job_dir / f"restart-{restart}").exists():
            restart += 1
        return restart

    def _keep_standby(self, launched: Launched, in_use: Sequence[str], resume_from: str | None) -> None:
        """Keep a standby agent on a node of the job outside the step (a spare), ready to take the job
        over if this agent's node dies; nothing when no node is free or none is needed."""
        if self.doors.start_standby is None or not self.spec.recovers_in_allocation or not self.leased:
            return
        if self.standby is not None and self.standby[0] in in_use and self.standby[1].exit_code() is None:
            return
        free = [n for n in in_use if n not in launched.slots and n != self.batch_host]
        if not free:
            self.standby = None
            return
        host = free[-1]
        argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=0",
                "--job-name=clusterctl-standby", self.python, "-m", "clusterctl.launcher.job", "standby",
                "--run-dir", str(self.run_dir), "--job-dir", str(self.job_dir), "--resume-from", resume_from or "",
                "--epoch", str(self.epoch + 1)]
        env = resized_environment(self.environ, in_use)
        env.pop("SLURM_HOSTFILE", None)
        try:
            self.standby = (host, self.doors.start_standby(argv, env))
        except OSError as exc:
            self.doors.say(f"cannot start the standby agent on {host} ({exc.strerror}): the job has none")

    def _drive(self, launched: Launched, in_use: Sequence[str], resume_from: str | None, restart: int) -> int:
        """Watch `launched` and what follows it, step after step, until the judge leaves the job to the
        supervisor or the run completes; the job's exit code."""
        hang_restarts = 0
        in_use = tuple(in_use)
        while True:
            watched = self._watch(launched, len(in_use) - self._needed(in_use))
            self.straggler_actions.step_ended(watched.lost_s)
            code, suspects, seen = watched.exit_code, watched.suspects, watched.seen
            if code is None:
                why = "; ".join(watched.hang.evidence) if watched.hang else \
                    "; ".join(f"{b.node}: {b.reason}" for b in suspects) if suspects else "?"
                self.doors.say(f"ending the step now: {why}")
                code = launched.step.stop(STOP_GRACE_SECONDS)
            elif code != 0:
                suspects = self._evidence_after(launched.slots)
                seen = self.doors.monotonic()
            ended = self.doors.monotonic()
            log = ""
            if code != 0 and not suspects and watched.hang is None and self.spec.restart.exit_actions:
                lines, _ = self.doors.read_log(self.log_path, launched.log_offset)
                log = "\n".join(lines) + "\n"
            failed_resume: list[str] = []
            if self.tiers is not None:
                if launched.signals is not None:  # the holdings the nodes reported last, before planning
                    launched.signals.poll()
                    self.tiers.observe(launched.signals.holdings())
                self._journal_resume(launched.signals.holdings() if launched.signals is not None else {},
                                     step_ended=True)
                if code != 0 and not suspects and watched.hang is None:
                    failed_resume = self.tiers.resume_failed(launched.job_dir)
            outcome = step_outcome(code, suspects, watched.hang.evidence if watched.hang else None, log,
                                   self.spec.restart.exit_actions, failed_resume)
            blamed = {b.node for b in outcome.blame}
            checkpoint = self._checkpoint([n for n in in_use if n not in blamed]) \
                if outcome.kind != OutcomeKind.COMPLETED else None
            self.budget = self._budget(self.budget)
            decision = judge(Happened(outcome, checkpoint.step if checkpoint else None,
                                      Allocation(in_use, self._needed(in_use), self.batch_host, hang_restarts),
                                      hung=watched.hang is not None), self.budget, self.spec.restart)
            self.ended = (outcome, decision)
            self.doors.say(decision.message)
            if launched.signals is not None:
                self._summarize(launched, launched.signals, launched.signals.poll(),
                                "recovering" if decision.act.in_allocation else "ended")
            if not decision.act.in_allocation:
                if self.tiers is not None:
                    self.tiers.record_pending()  # the run's next job plans from it
                return 0 if decision.act == Act.DONE else code or 1
            if decision.act == Act.RESTART_IN_PLACE and watched.hang is not None:
                hang_restarts += 1
            restart += 1
            launched = self._restart(decision, restart, checkpoint, resume_from, seen, ended)
            resume_from = checkpoint.path if checkpoint else resume_from
            self.budget = decision.budget
            in_use = decision.nodes
            self._keep_standby(launched, in_use, resume_from)

    def _journal_resume(self, holdings: Mapping[str, CheckpointHoldings], *, step_ended: bool = False) -> None:
        """Journal where the running step's resume came from and how long the slowest node's read took: one
        line per resumed step, once every node said (from the holdings in their reports), else at its end."""
        assert self.tiers is not None
        line = self.tiers.resume_line(holdings, self.job_id, self.doors.now(), step_ended=step_ended)
        if line is None:
            return
        self.doors.say(f"resumed {resumed_text(line)}")
        try:
            append_run_event(self.run_dir / "journal.jsonl", line)
        except OSError as exc:
            self.doors.say(f"cannot journal the resume ({exc.strerror}): status and report will not show it")

    def _needed(self, in_use: Sequence[str]) -> int:
        """Nodes the job needs of `in_use`: all of them unless it recovers inside the allocation (a job
        without spares, or one whose spec asks for recovery by resubmission, swaps nothing)."""
        return self.spec.job.nodes if self.spec.recovers_in_allocation else len(in_use)

    def _budget(self, counted: RestartBudget) -> RestartBudget:
        """The run's restart budget as its journal says (`counted`, what this agent last knew, when the
        journal cannot be read): the supervisor's resubmissions and every restart inside this job."""
        try:
            return replay(read_run_journal(self.run_dir / "journal.jsonl").events).budget
        except (OSError, RecordError) as exc:
            self.doors.say(f"cannot read the run's journal ({exc}); judging with the restarts counted here")
            return counted

    def _restart(self, decision: Recovery, restart: int, checkpoint: Checkpoint | None, resume_from: str | None,
                 seen: float, ended: float) -> Launched:
        """Act on a restart inside the allocation: give the blamed nodes back, start step `restart` on
        `decision.nodes` from `checkpoint`, and journal it (one restart of the run's budget)."""
        self._check_in_charge()
        blamed = [b.node for b in decision.blame]
        given_back: tuple[str, ...] = tuple(n for n in blamed if n in self.out_of_job)
        if blamed and len(given_back) < len(blamed):
            try:
                # scontrol writes slurm_job_<id>_resize.{sh,csh} into its working directory: ours, not the user's.
                with contextlib.chdir(self.job_dir):
                    self.doors.slurm.shrink_job(self.job_id, decision.nodes)
                given_back = tuple(blamed)
            except SlurmCommandError as exc:  # recover all the same; the node stays in the job until it ends
                self.doors.say(f"could not give {', '.join(blamed)} back to Slurm: {exc}")
        shrunk = self.doors.monotonic()
        job_dir = self.job_dir / f"restart-{restart}"
        resume_from = checkpoint.path if checkpoint else resume_from
        slots: tuple[str, ...] = ()
        try:
            launched = self._launch(job_dir, decision.nodes, resume_from, restart)
            slots = launched.slots
        finally:  # the blame is journaled even when the new step cannot start: a resubmission avoids it
            done = self.doors.monotonic()
            until = self.doors.now() + self.spec.restart.blame_hours * 3600
            append_run_event(self.run_dir / "journal.jsonl", RecoveredInAllocation(
                at=self.doors.now(), job_id=self.job_id, restart=restart,
                blame=tuple(b.to_journal(until) for b in decision.blame), nodes=slots, given_back=given_back,
                checkpoint_step=checkpoint.step if checkpoint else None,
                # Never a folder the checkpoint is not in: one the nodes' tiers give is named by its step.
                checkpoint=checkpoint.path if checkpoint and not checkpoint.from_tiers else None,
                phases=(("end_step", round(ended - seen, 3)), ("give_back", round(shrunk - ended, 3)),
                        ("plan_and_launch", round(done - shrunk, 3))),
                reason=decision.message if not decision.blame else "", agent=self.batch_host,
                took_over_from=self.took_over_from))
            self.took_over_from = ""
            if self.tiers is not None:  # the step has started (or could not): off the recovery's critical path
                self.tiers.record_pending()
        # With tiers a step without a checkpoint starts afresh (_launch hands it no earlier path).
        began = checkpoint.where if checkpoint else "the start" if self.tiers is not None else resume_from or "the start"
        self.doors.say(f"restart {restart}: a new step on {' '.join(slots)} from {began} (no queue wait)")
        return launched

    def _checkpoint(self, present: Sequence[str] = ()) -> Checkpoint | None:
        """The checkpoint the next step resumes from; with tiers, the newest complete across the tiers of
        the nodes `present` (every other node's fast tier counts as gone)."""
        if self.tiers is not None:
            return self.tiers.resume_point(present)
        return resume_point(self.spec.checkpoint_dir(str(self.run_dir)), self.spec.checkpoint.validator, self.doors.say)
