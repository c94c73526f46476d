"""Slurm Prolog for clusterctl nodes (configure with PrologFlags=Alloc).

Runs as root on every allocated node before the job starts, with no PATH and no
SLURM_CONF.  It refuses the job (exit 1: Slurm drains the node and requeues the job)
when a GPU of the job is lost, has uncorrectable errors, a failed or pending row remap,
retired pages at the limit, or healthd holds an unhandled fault for it; otherwise exit 0.
What it does: prolog/run.py; the checks and the policy are healthd's own (healthd/gate.py).  A job it
lets in then gets the node back from checkpoint tiers nobody resumes from (healthd.toml `tier_bases`;
prolog/tier_reclaim.py, healthd/stale_tiers.py).
"""

from __future__ import annotations

import sys


def main() -> None:
    from clusterctl.healthd.hook_command import hook_main
    from clusterctl.prolog.run import run_prolog

    sys.exit(hook_main("prolog", "Prolog={path} and PrologFlags=Alloc",
                       "Slurm's Prolog: refuse the job (exit 1) when a GPU it was given is broken; otherwise let it start (exit 0).",
                       run_prolog))
