"""Acting on what the straggler watch finds, for whoever watches the job's progress: the in-allocation
agent (jobs with spares, on the batch host) and the supervisor (every other job, on the login node).

Per node found slow (once per job): ask its GPUs why (`healthd evidence --job-gpus --json`, run on the
node as a one-off `srun --overlap` step of the job: only the GPUs the job has there, so that another
job's GPUs on a shared node are neither shown to this job's user nor taken to explain its slowdown),
ask the verdict (launcher/pure/straggler_verdict.py: report, exclude or swap, drain or not), drain
if it says so, and journal a `straggler` event with the evidence.  Only effects live here.
The drain goes through the core's drain door (clusterctl/slurm/drains.py) as the straggler owner: a
`clusterctl straggler:` reason, never over another drain, within the straggler verdicts' own share
of the partition (never a slot of healthd's breaker).  A node name read from the progress files
that is not one never reaches srun or scontrol.  Also keeps `<job_dir>/step_times.json`, the per-node table that
`clusterctl status` and `report` show.  Excluding (the journal's blame, honoured at the next
submission) and swapping (the agent's restart on a spare) are the callers' business.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from clusterctl.clock import utc
from clusterctl.errors import SlurmCommandError
from clusterctl.launcher.pure.classify import Blame
from clusterctl.launcher.pure.straggler_verdict import SwapRoom, straggler_verdict
from clusterctl.launcher.pure.straggler_watch import StragglerWatch
from clusterctl.records.actions import Action
from clusterctl.records.drain_reason import STRAGGLER, DrainReason
from clusterctl.records.gpu_evidence import GpuEvidence
from clusterctl.records.node_step_times import NodeStepTime, NodeStepTimes, write_node_step_times
from clusterctl.records.run_journal import StragglerFound, append_run_event
from clusterctl.records.versioned import RecordError, parse_json_record
from clusterctl.slurm.drains import DrainApplied
from clusterctl.slurm.names import node_name_problem
from clusterctl.text import one_line

STRAGGLER_REASON = "straggler: its ranks computed persistently slower than the job's"
"""The `reason` of a Blame for a node evicted for slowness."""
GPU_EVIDENCE_TIMEOUT = 60.0
"""How long the one-off step that asks a slow node's GPUs (healthd evidence) may take."""

GpuEvidenceReader = Callable[[str, Mapping[str, str]], "GpuEvidence | str"]
"""What a node's GPUs say now, asked with a job's environment (SLURM_JOB_ID), or why that could not be read."""
StragglerDrain = Callable[[str, DrainReason], DrainApplied]
"""The drain door for a straggler verdict (`clusterctl.slurm.drains.SlurmDrains().drain`): drain a node with a
straggler reason if the door's rules allow; raises SlurmCommandError when Slurm refuses (e.g. not an operator)."""


def run_one_off_step(argv: list[str], env: Mapping[str, str], timeout: float, what: str) -> bytes | str:
    """Run a one-off srun step of the job and wait at most `timeout` s (then it is killed): its stdout,
    or why it gave none (`what` names it: "healthd evidence on node2"); never raises."""
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{what} did not answer within {timeout:g} s"
    except OSError as exc:
        return f"cannot run srun: {exc.strerror}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{what} failed (exit {done.returncode}): {one_line(said[-1][:200]) if said else 'no message'}"
    return done.stdout


def srun_gpu_evidence(python: str) -> GpuEvidenceReader:
    """Ask `node`'s GPUs through `healthd evidence --job-gpus --json`, run there as a one-off step of
    the job named by the environment's SLURM_JOB_ID (--overlap: beside the training step, on the
    resources it holds; srun attaches to that allocation from its batch script and from a login node
    alike).  The step is given all of the job's GPUs on `node` and healthd reads only those (Slurm names
    them in the step's SLURM_STEP_GPUS; the record says which were read)."""
    def read(node: str, env: Mapping[str, str]) -> GpuEvidence | str:
        problem = node_name_problem(node)
        if problem is not None:  # never an option or a hostlist of srun
            return f"not asked: {problem}"
        argv = ["srun", "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--quiet", python, "-m",
                "clusterctl.healthd", "evidence", "--job-gpus", "--json"]
        # The caller's own GPU lists (the batch host's, or the standby agent's node's) are not `node`'s:
        # only what Slurm sets in the new step may name its GPUs (it did so, and unset them in a job
        # without GPUs, on 22.05 and 26.05; not relied on).
        step_env = {k: v for k, v in env.items() if k not in ("SLURM_HOSTFILE", "SLURM_DISTRIBUTION",
                                                              "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")}
        done = run_one_off_step(argv, step_env, GPU_EVIDENCE_TIMEOUT, f"healthd evidence on {node}")
        if isinstance(done, str):
            return done
        try:
            return GpuEvidence.from_json(parse_json_record(done, f"healthd evidence on {node}"),
                                         f"healthd evidence on {node}")
        except RecordError as exc:
            return str(exc)
    return read


@dataclass
class StragglerDoors:
    """The side effects of acting on a straggler, passed in so tests can swap them."""

    now: Callable[[], float]
    say: Callable[[str], None]
    gpu_evidence: GpuEvidenceReader | None = None
    drain: StragglerDrain | None = None
    """The drain door (None: never drain)."""


class StragglerActions:
    """One job's stragglers: each node journaled once, the step-time table, the time lost so far."""

    def __init__(self, run_dir: Path, job_dir: Path, job_id: str, action: str, blame_hours: float,
                 doors: StragglerDoors) -> None:
        self.run_dir, self.job_dir, self.job_id = run_dir, job_dir, job_id
        self.action, self.blame_hours, self.doors = action, blame_hours, doors
        self.seen: set[str] = set()
        self.lost_before = 0.0
        """Seconds lost to slow nodes in the job's earlier steps (in-allocation restarts)."""

    def step_ended(self, lost_s: float) -> None:
        """A step of the job ended having lost `lost_s` to slow nodes (the next step's table adds it)."""
        self.lost_before += lost_s

    def write_table(self, watch: StragglerWatch) -> None:
        """Write `<job_dir>/step_times.json` from the watch (nothing until a node was measured)."""
        if not watch.nodes:
            return
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 6)
        lines = tuple(NodeStepTime(n.node, n.ranks, rounded(n.seconds), rounded(n.ratio),
                                   "straggler" if n.straggler else "slow" if n.slow_steps else "ok", round(n.lost_s, 3))
                      for n in sorted(watch.nodes.values(), key=lambda n: n.node))
        step = watch.step
        record = NodeStepTimes(self.job_id, self.doors.now(), step, rounded(watch.reference),
                               round(self.lost_before + watch.lost_s, 3), lines)
        try:
            write_node_step_times(self.job_dir, record)
        except OSError as exc:  # the table is for people; the watch goes on without it
            self.doors.say(f"cannot write the step-time table in {self.job_dir}: {exc.strerror}")

    def act(self, found: StragglerFound, env: Mapping[str, str], room: SwapRoom | None = None) -> Blame | None:
        """Journal `found` (as the straggler watch measured it), ask its GPUs why, and carry out the
        verdict on it (launcher/pure/straggler_verdict.py): drain it through the door, blame it; the Blame
        to swap it for a spare now, or None (reported, or excluded from the next submission on).
        `room`: what the in-job agent could swap it with (None: the job has no agent)."""
        if found.node in self.seen:
            return None
        self.seen.add(found.node)
        problem = node_name_problem(found.node)
        if problem is not None:  # read from a progress file: neither asked, drained, blamed nor excluded
            self.doors.say(f"straggler ignored: {problem}")
            return None
        hardware, note = self._hardware(found.node, env)
        verdict = straggler_verdict(found.node, hardware, self.action, room, self.doors.drain is not None)
        notes = (*verdict.notes, *([f"GPU evidence: {note}"] if note else []))
        until = self.doors.now() + self.blame_hours * 3600
        blame = Blame(found.node, STRAGGLER_REASON, (*found.evidence, *hardware, *notes))
        drain = self._drain(found.node) if verdict.drain else verdict.drain_note if verdict.evicted else ""
        append_run_event(self.run_dir / "journal.jsonl", replace(
            found, at=self.doors.now(), job_id=self.job_id, evidence=(*found.evidence, *notes), hardware=hardware,
            action=verdict.done, blame=(blame.to_journal(until),) if verdict.evicted else (), drain=drain))
        what = {"reported": "reported", "excluded": "avoided from the next resubmission on",
                "swapped": "swapping it for a spare now"}[verdict.done]
        self.doors.say(f"straggler {found.node}: {'; '.join(found.evidence)}; GPUs: "
                       f"{'; '.join(hardware) or 'nothing explains it'}; {what}{'; ' + drain if drain else ''}")
        return blame if verdict.done == "swapped" else None

    def _drain(self, node: str) -> str:
        """Drain `node` through the door as the straggler owner; what became of it."""
        assert self.doors.drain is not None  # the verdict drains only when a door is there
        reason = DrainReason(kind="slow-gpus", action=Action.DRAIN_RESET, at=utc(self.doors.now()), owner=STRAGGLER)
        try:
            return self.doors.drain(node, reason).describe()
        except SlurmCommandError as exc:
            return f"not drained: Slurm refused ({exc}); healthd's own clock-events check is the admins' path"

    def _hardware(self, node: str, env: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
        """What `node`'s GPUs say that explains a slowdown (empty: nothing), and a note: which GPUs were read
        and why, what could not be read, or why they could not be asked."""
        if self.doors.gpu_evidence is None:
            return (), "the GPUs were not asked (no evidence reader)"
        evidence = self.doors.gpu_evidence(node, env)
        if isinstance(evidence, str):
            return (), evidence
        read = [f"read {evidence.scope}"] if evidence.scope else []
        return evidence.slowdown_reasons(), "; ".join([*read, *evidence.problems])
