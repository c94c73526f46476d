"""Record what real Slurm clients print when Slurm cannot be reached, for tests/data/slurm/unreachable.json.

Two cases, on a host with the Slurm clients installed and no /etc/slurm/slurm.conf: `no-config` (no
SLURM_CONF and no DNS SRV record for configless Slurm: a login node set up without Slurm's configuration) and `controller-down` (a slurm.conf whose
slurmctld does not answer: nothing listens on its port).  Run: python3 scripts/record-unreachable-slurm.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COMMANDS = (["sbatch", "--version"], ["squeue", "--json", "-t", "all", "-j", "2,3"], ["scontrol", "show", "topology"],
            ["scontrol", "show", "config"], ["sacct", "--json", "-j", "2,3"])
CONF = """ClusterName=gone
SlurmctldHost=ctl(127.0.0.1)
SlurmctldPort=6899
MessageTimeout=2
AuthType=auth/none
CredType=cred/none
NodeName=node1 CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes=node1 Default=YES
"""


def record(env: dict[str, str]) -> dict[str, dict[str, object]]:
    done = {}
    for argv in COMMANDS:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        done[" ".join(argv)] = {"argv": argv, "returncode": result.returncode, "stdout": result.stdout,
                                "stderr": result.stderr}
    return done


def main() -> None:
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "slurm-client"], capture_output=True, text=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "slurm.conf"
        conf.write_text(CONF)
        cases = {"no-config": record(base),
                 "controller-down": record({**base, "SLURM_CONF": str(conf)})}
    out = {"slurm": f"slurm-client {version.stdout.strip()}",
           "about": "what real Slurm clients print when Slurm cannot be reached: scripts/record-unreachable-slurm.py",
           "controller_down_conf": CONF, "cases": cases}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
