"""Starting one step of the job's ranks: its srun argv and environment, planned over the nodes the job has.

The agent (`launcher/job/agent.py`) starts every step through a `StepLauncher`: it plans the rank
map (`launcher/job/steps.plan_for_job`), keeps the nodes that hold the resume's checkpoint copies
in the map (multi-level checkpoints), hands the step the report channel's settings and starts srun
through the agent's doors.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from clusterctl.errors import PlacementError
from clusterctl.launcher.job.agent_doors import RANKS_STEP_NAME, AgentDoors, Step
from clusterctl.launcher.job.checkpoint_plan import TierPlanner
from clusterctl.launcher.job.signal_watch import Inbox, SignalWatch
from clusterctl.launcher.pure.checkpoint_tiers import nodes_for_map
from clusterctl.launcher.pure.node_signals import SignalPolicy, slurm_sweep_seconds
from clusterctl.launcher.pure.parallel import ParallelLayout, data_parallel_environment
from clusterctl.launcher.pure.placement import PlannedMap
from clusterctl.launcher.pure.shrink import nodes_for
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.records.peer_beat import PEER_PORT_ENV, PEER_PORTS
from clusterctl.records.node_report import REPORT_ADDR_ENV, REPORT_INTERVAL_ENV, REPORT_KEY_ENV, REPORT_LAUNCH_ENV
from clusterctl.records.rank_map import RankMap
from clusterctl.slurm import hostlist


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
            f"--job-name={RANKS_STEP_NAME}", python, "-m", "clusterctl.launcher.job", wrapper, "--job-dir",
            str(job_dir), "--", *command]
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


def open_report_inbox(doors: AgentDoors, nodes: int) -> tuple[bytes, Inbox | None]:
    """The job's report key and the inbox that hears the nodes with it (None, said: the inbox cannot
    open, and the agent watches its `nodes` through Slurm only)."""
    # The job's report key: in the step's environment only, so a datagram from anyone else
    # (another user's process on a shared node, a forged packet) is refused unread.
    report_key = secrets.token_bytes(32)
    inbox: Inbox | None = None
    try:
        inbox = doors.open_inbox(report_key)
    except OSError as exc:
        doors.say(f"cannot open the report inbox ({exc.strerror}): watching the nodes through Slurm only "
                  f"(every {slurm_sweep_seconds(nodes):g} s), with no hang or straggler watch")
    return report_key, inbox


class StepLauncher:
    """Starts the job's steps, each on the nodes it is given, numbering their launches."""

    def __init__(self, run_dir: Path, spec: JobSpec, environ: Mapping[str, str], doors: AgentDoors, *,
                 python: str, job_id: str, batch_host: str, tiers: TierPlanner | None, report_key: bytes,
                 inbox: Inbox | None) -> None:
        self.run_dir, self.spec, self.environ, self.doors = run_dir, spec, environ, doors
        self.python, self.job_id, self.batch_host, self.tiers = python, job_id, batch_host, tiers
        self.report_key, self.inbox = report_key, inbox
        self.log_path = run_dir / "logs" / f"{self.job_id}.out"  # sbatch --output: the agent's own stdout
        self.launches = 0

    def step_spec(self, layout: ParallelLayout | None) -> JobSpec:
        """The spec as a step at `layout` sees it: the spec's own, or (a job that shrank) its layout and the
        nodes that layout fills, so the step's task count and the command's {dp} follow the step."""
        if layout is None or layout == self.spec.parallel:
            return self.spec
        nodes = nodes_for(layout, self.spec.job.gpus_per_node, layout.dp)
        return replace(self.spec, parallel=layout, job=replace(self.spec.job, nodes=nodes))

    def launch(self, job_dir: Path, nodes: Sequence[str], resume_from: str | None, restart: int = 0,
               layout: ParallelLayout | None = None, planned: PlannedMap | None = None) -> Launched:
        """Start step `restart` (0: the job's first) of the ranks on `nodes`, from `resume_from` (with
        tiers: from the tiers' plan), its files in `job_dir`; at `layout` (None: the spec's) after a shrink,
        whose map the judge `planned` (taken when it is the map these nodes get, else planned again)."""
        from clusterctl.launcher.job.steps import plan_for_job
        from clusterctl.launcher.pure.render import launch_command
        spec = self.step_spec(layout)
        env = resized_environment(self.environ, nodes)
        env.update(data_parallel_environment(self.spec.parallel.dp, spec.parallel.dp))
        rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm, layout=spec.parallel, planned=planned)
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
                    rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm, candidates=chosen,
                                            layout=spec.parallel)
                except (PlacementError, ValueError) as exc:  # the first map stands: a slower resume, not none
                    self.doors.say(f"cannot make the map of {' '.join(chosen)} ({exc}); keeping the first")
                    rank_map = plan_for_job(self.run_dir, job_dir, env, self.doors.slurm, layout=spec.parallel,
                                            planned=planned)
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
        command = launch_command(spec, str(self.run_dir), resume_from)
        argv, env["SLURM_HOSTFILE"] = step_argv(spec, self.python, job_dir, command)
        launch = str(self.launches)
        self.launches += 1
        policy = SignalPolicy.for_nodes(len(rank_map.rank_map.slots))
        if self.inbox is not None:
            env.update({REPORT_KEY_ENV: self.report_key.hex(),
                        REPORT_ADDR_ENV: f"{self.batch_host}:{self.inbox.port}",
                        REPORT_LAUNCH_ENV: launch, REPORT_INTERVAL_ENV: f"{policy.heartbeat:g}",
                        # A new port for each launch: the last step's reporters may hold theirs a moment longer.
                        PEER_PORT_ENV: str(PEER_PORTS[0] + secrets.randbelow(PEER_PORTS[1] - PEER_PORTS[0]))})
        offset = self.doors.read_log(self.log_path, None)[1]  # where this step's lines begin
        started_at = self.doors.now()
        step = self.doors.start_step(argv, env)
        if self.tiers is not None:
            self.tiers.step_started(restart, started_at)
        watch = SignalWatch(self.inbox, self.job_id, launch, rank_map.rank_map.slots, policy, started_at,
                            self.doors.now) if self.inbox is not None else None
        return Launched(step, job_dir, rank_map.rank_map, started_at, offset, watch, launch)
