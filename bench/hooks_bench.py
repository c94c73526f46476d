"""Benchmark the Slurm hooks on a testbed node with 8 emulated GPUs: wall time of one run.

    sudo .venv/bin/python bench/hooks_bench.py [--runs 100]

Runs clusterctl-prolog (job on all 8 GPUs), clusterctl-epilog and clusterctl-healthcheck as
Slurm does — root, empty environment — on node1, with healthd running and then stopped.
Uses its own testbed (/tmp/ctb-hooks).  Writes bench/results/hooks.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

from clusterctl_testbed.cluster import Testbed  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402

LAYOUT = Layout(root=Path("/tmp/ctb-hooks"), namespace_prefix="ctbh-")
BIN = Path(sys.executable).parent



def timed(tb: Testbed, hook: str, job: int) -> float:
    argv = [*tb.enter("node1"), "env", "-i", f"SLURM_JOB_ID={job}", "SLURM_JOB_GPUS=0,1,2,3,4,5,6,7",
            "SLURMD_NODENAME=node1", str(BIN / hook)]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{hook} failed on a healthy node: {done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    tb = Testbed(LAYOUT)
    tb.up(timeout=90, slurm="host")  # the figures in the README are this machine's Slurm
    report: dict[str, dict] = {}
    try:
        for healthd in ("running", "stopped"):
            if healthd == "stopped":
                tb.stop_daemon("healthd:node1")
            for hook in ("clusterctl-prolog", "clusterctl-epilog", "clusterctl-healthcheck"):
                times = [timed(tb, hook, 1000 + i) for i in range(args.runs)]
                report[f"{hook} (healthd {healthd})"] = {
                    "p50_s": round(statistics.median(times), 3), "p95_s": round(percentile(times, 0.95), 3),
                    "max_s": round(max(times), 3), "runs": len(times)}
    finally:
        tb.down(quiet=True)
    out = Path(__file__).resolve().parent / "results" / "hooks.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for name, r in report.items():
        print(f"{name:45} p50 {r['p50_s']:.3f} s  p95 {r['p95_s']:.3f} s  max {r['max_s']:.3f} s ({r['runs']} runs)")


if __name__ == "__main__":
    main()
