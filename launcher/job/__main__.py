"""`python -m clusterctl.launcher.job {plan,rank,node,agent,standby,reporter,stacks}`: what a generated sbatch script
runs inside the job (sbatch_templates/*.sbatch name this module; tests/unit/test_architecture.py
checks that every module named in a template or an argv exists and runs inside the job).

Argument parsing only: the steps are `clusterctl.launcher.job.steps`, the in-allocation agent
`clusterctl.launcher.job.agent`, a node's reporter (started by the first task of each node of an
agent's step) `clusterctl.launcher.job.reporter`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.launcher.job.steps import exec_node, exec_rank, plan_for_job, say
from clusterctl.launcher.job import steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterctl.launcher.job", description=steps.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p_plan = sub.add_parser("plan")
    p_plan.add_argument("--run-dir", required=True, type=Path)
    p_plan.add_argument("--job-dir", required=True, type=Path)
    p_agent = sub.add_parser("agent", help="plan, run the ranks as one srun step, recover node failures "
                                             "inside the allocation (jobs with spares)")
    p_agent.add_argument("--run-dir", required=True, type=Path)
    p_agent.add_argument("--job-dir", required=True, type=Path)
    p_agent.add_argument("--resume-from", default="", help="the checkpoint this attempt resumes from ('' for none)")
    p_standby = sub.add_parser("standby", help="on a spare node of a job with spares: take the job over when the "
                                               "node running its agent (the batch host) dies")
    p_standby.add_argument("--run-dir", required=True, type=Path)
    p_standby.add_argument("--job-dir", required=True, type=Path)
    p_standby.add_argument("--resume-from", default="", help="the checkpoint this attempt resumed from ('' for none)")
    p_standby.add_argument("--epoch", required=True, type=int, help="the epoch of the job's lease it would take")
    p_reporter = sub.add_parser("reporter", help="one per node of an agent's step: report the node's ranks and "
                                                   "healthd's verdict to the agent (started by the rank wrapper)")
    p_reporter.add_argument("--watch-pid", required=True, type=int,
                            help="end 2 s after this process (the task that started the reporter) is gone")
    p_stacks = sub.add_parser("stacks", help="on a node of a hung step: each of its ranks' Python stack (py-spy) "
                                             "into <job-dir>/stacks/<node>.json (run by the agent)")
    p_stacks.add_argument("--job-dir", required=True, type=Path)
    p_stacks.add_argument("--launch", required=True, help="the hung step's launch number")
    for name in ("rank", "node"):
        p = sub.add_parser(name)
        p.add_argument("--job-dir", required=True, type=Path)
        p.add_argument("--under-torchrun", action="store_true")
        p.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.what == "plan":
            from clusterctl.slurm.commands import Slurm
            plan_for_job(args.run_dir, args.job_dir, os.environ, Slurm())
            return 0
        if args.what == "agent":
            from clusterctl.launcher.job.agent import Agent
            from clusterctl.launcher.job.agent_doors import collect_garbage_rarely, default_doors
            collect_garbage_rarely()
            from clusterctl.launcher.shared.runs import RunDir
            agent = Agent(args.run_dir, args.job_dir, RunDir(args.run_dir).spec(), os.environ, default_doors())
            return agent.run(args.resume_from or None)
        if args.what == "standby":
            from clusterctl.launcher.job import standby
            return standby.main(args.run_dir, args.job_dir, args.resume_from or None, args.epoch, os.environ)
        if args.what == "reporter":
            from clusterctl.launcher.job import reporter
            return reporter.main(args.watch_pid, os.environ)
        if args.what == "stacks":
            from clusterctl.launcher.job.rank_stacks import stacks_main
            return stacks_main(args.job_dir, args.launch, os.environ)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("no command after --")
        if args.what == "rank":
            return exec_rank(args.job_dir, command, os.environ, under_torchrun=args.under_torchrun)
        return exec_node(args.job_dir, command, os.environ)
    except ClusterctlError as exc:
        say(f"error: {exc}")
        return 1
    except (OSError, KeyError, ValueError) as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return 1




if __name__ == "__main__":
    sys.exit(main())
