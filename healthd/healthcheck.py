"""Slurm's HealthCheckProgram for clusterctl nodes (`clusterctl-healthcheck`, or `healthd check`).

Answers from clusterctl.healthd's cached state in milliseconds when the daemon is alive (no NVML
call), falls back to a quick direct check when it is not (and says so), drains the node
with a healthd-owned reason on a blocking verdict, and exits within Slurm's 60 s limit.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    from clusterctl.healthd.hooks import run_health_check

    sys.exit(run_health_check(dict(os.environ)))
