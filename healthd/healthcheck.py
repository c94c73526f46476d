"""Slurm's HealthCheckProgram for clusterctl nodes.

Slurm runs it as root with an empty environment every HealthCheckInterval and at
slurmd start.  Until healthd's cached verdicts exist it has nothing to judge, so it
passes (exit 0) and says so on stderr, which slurmd logs.
"""

from __future__ import annotations

import sys


def main() -> None:
    print("clusterctl-healthcheck: no healthd verdicts on this node yet; passing", file=sys.stderr)
    sys.exit(0)
