"""The active agent's hold on its job: its epoch of the lease, whether it is still in charge, its standby.

The lease (`clusterctl/records/agent_lease.py`) fences two agents of one job: the agent in charge
holds the highest epoch, and every action of an agent that matters first checks that no standby
took a higher one (docs/architecture.md, "The batch host").  The standby's own side, watching this
agent and taking the job over, is `launcher/job/standby.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterctl.launcher.job.agent_doors import AgentDoors, Step
from clusterctl.launcher.job.step_launch import Launched, resized_environment
from clusterctl.records.agent_lease import AgentLease, current_lease, take_lease
from clusterctl.records.versioned import RecordError


class StoodDown(Exception):
    """Another agent holds a higher epoch of the job's lease: this one must not act again."""


class Leadership:
    """One agent's epoch of its job's lease, the standby it keeps, and whom it took the job over from."""

    def __init__(self, run_dir: Path, job_dir: Path, doors: AgentDoors, *, python: str, epoch: int,
                 batch_host: str) -> None:
        self.run_dir, self.job_dir, self.doors = run_dir, job_dir, doors
        self.python, self.epoch, self.batch_host = python, epoch, batch_host
        self.leased = False
        self.took_over_from = ""
        self.out_of_job: frozenset[str] = frozenset()
        """Blamed nodes Slurm already took out of the job (a dead batch host): nothing to give back."""
        self.standby: tuple[str, Step] | None = None

    def lead(self, why: str = "") -> None:
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

    def check_in_charge(self) -> None:
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

    def keep_standby(self, launched: Launched, in_use: Sequence[str], resume_from: str | None,
                     environ: Mapping[str, str], *, recovers_in_allocation: bool) -> None:
        """Keep a standby agent on a node of the job outside the step (a spare), ready to take the job
        over if this agent's node dies; nothing when no node is free or none is needed (a job that does
        not `recovers_in_allocation`).  `environ`: the batch script's, which the standby's step gets resized."""
        if self.doors.start_standby is None or not recovers_in_allocation or not self.leased:
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
        env = resized_environment(environ, in_use)
        env.pop("SLURM_HOSTFILE", None)
        try:
            self.standby = (host, self.doors.start_standby(argv, env))
        except OSError as exc:
            self.doors.say(f"cannot start the standby agent on {host} ({exc.strerror}): the job has none")
