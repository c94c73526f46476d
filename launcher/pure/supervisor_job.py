"""The supervisor as a small Slurm job, so that no login node has to stay up for a run (pure: the script).

`clusterctl submit SPEC --supervise --in-slurm` (or `clusterctl supervise RUN --in-slurm`) submits
this script instead of supervising from the login node: one task, one CPU, no GPU, `--requeue`.
It runs the same `clusterctl supervise RUN` -- whose journal-first design makes each of its steps
idempotent -- and keeps it running:

- the supervisor's process dies (killed, OOM, a crash): the loop starts it again after
  RESTART_DELAY seconds; it replays the journal and carries on (giving up only after
  QUICK_FAILURES_MAX failures in a row that each lasted under a minute: a broken install, not bad luck);
- another supervisor holds the run (someone watching it in the foreground, exit 9): the loop waits
  and tries again, so the Slurm-kept one takes over when the person detaches;
- the node dies: Slurm requeues the job (`--requeue`) and it starts again on another node;
- its time limit comes: Slurm sends USR1 two minutes before (`--signal=B:USR1@120`) and the
  script requeues its own job.

It ends when the run does (`supervise` exits 0 done, 1 stopped, 2 cancelled).  Its cost to slurmctld
is the supervisor's own (one single-job query per poll interval, shared by the supervisors of one
runs directory), plus one requeue per time limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.launcher.pure.shell import quote

RESTART_DELAY = 10
"""Seconds between a dead supervisor process and its successor."""
QUICK_FAILURES_MAX = 10
"""Supervisor processes in a row that fail within a minute before the job gives up."""
HELD_WAIT = 30
"""Seconds between two tries while another supervisor holds the run."""
SCRIPT_NAME = "supervisor.sbatch"
LOG_NAME = "supervisor-slurm.log"


@dataclass(frozen=True)
class SupervisorJob:
    """What `sbatch` gets: its argv (the script's path last) and the script."""

    argv: tuple[str, ...]
    script: str


def supervisor_job(run_dir: str, python: str, job_records: str, *, partition: str | None = None,
                   account: str | None = None) -> SupervisorJob:
    """The sbatch request that keeps `clusterctl supervise RUN` running in Slurm."""
    options = ["--job-name=clusterctl-supervisor", "--ntasks=1", "--cpus-per-task=1", "--requeue",
               "--open-mode=append", f"--output={run_dir}/{LOG_NAME}", "--signal=B:USR1@120"]
    if partition:
        options.append(f"--partition={partition}")
    if account:
        options.append(f"--account={account}")
    argv = ("sbatch", "--parsable", *options, f"{run_dir}/{SCRIPT_NAME}")
    supervise = f'{quote(python)} -c "from clusterctl.launcher.login.cli import main; main()" supervise ' \
                f'"$run" --job-records {quote(job_records)}'
    script = f"""#!/bin/bash
# clusterctl's supervisor, kept alive by Slurm (launcher/pure/supervisor_job.py): it runs
# `clusterctl supervise` for one run until the run is done, stopped or cancelled.
set -u
# Values are single-quoted on purpose (literal text, never expanded):
# shellcheck disable=SC2016,SC1003
run={quote(run_dir)}
own_job=$SLURM_JOB_ID
# The jobs this supervisor submits must not inherit this job's Slurm settings (sbatch exports the
# environment: SLURM_CPUS_PER_TASK=1 would reach their srun).
for name in $(compgen -e); do
  case $name in SLURM_CONF) ;; SLURM_*|SBATCH_*|SRUN_*|SALLOC_*) unset "$name" ;; esac
done

# Two minutes before the time limit: back into the queue (the journal keeps every decision).
trap 'echo "clusterctl: time limit near: requeueing the supervisor job $own_job"; scontrol requeue "$own_job"' USR1

quick=0
held=0
while true; do
  started=$(date +%s)
  {supervise} &
  child=$!
  wait "$child"
  code=$?
  while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done  # a trap interrupted the wait
  case $code in
    0|1|2) exit 0 ;;  # the run is over: done, stopped or cancelled
    9)  held=$((held + 1))
        if [ "$held" -ge 120 ]; then echo "clusterctl: the run stayed held or unreadable for an hour; giving up"; exit 1; fi
        sleep {HELD_WAIT}; continue ;;
  esac
  held=0
  if [ $(( $(date +%s) - started )) -lt 60 ]; then quick=$((quick + 1)); else quick=0; fi
  if [ "$quick" -ge {QUICK_FAILURES_MAX} ]; then
    echo "clusterctl: the supervisor failed {QUICK_FAILURES_MAX} times in a row within a minute (exit $code); giving up"
    exit 1
  fi
  echo "clusterctl: the supervisor exited $code; starting it again in {RESTART_DELAY} s"
  sleep {RESTART_DELAY}
done
"""
    return SupervisorJob(argv, script)
