"""Slurm Epilog for clusterctl nodes.

Runs as root on every node of a job after it ends.  Kills stray processes of the job; writes
the job's health record for this node (<job_records_dir>/<job>/<node>.json: every Xid, ECC
error, lost GPU... during the job, with the policy's verdict) so the supervisor learns which
node broke a job; then drains the node for a hardware fault, its Slurm calls within what is
left of hook_timeout.  Always exits 0 (a failing epilog would drain the node with a reason
nobody can act on).  What it does: epilog/run.py.
"""

from __future__ import annotations

import sys


def main() -> None:
    from clusterctl.healthd.hook_command import hook_main
    from clusterctl.epilog.run import run_epilog

    sys.exit(hook_main("epilog", "Epilog={path}",
                       "Slurm's Epilog: kill the job's leftover tasks, record what broke on this node during the job, drain for a hardware fault. Always exit 0 inside a job.",
                       run_epilog))
