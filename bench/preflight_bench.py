"""Benchmark the prolog's pre-flight diagnostic against its budget: wall time of `preflight` running the
testbed's emulated `dcgmi diag -r 1 -j` (dcgmi_emu.py) through healthd's real runner and parser.

    .venv/bin/python bench/preflight_bench.py [--runs 50]

No testbed is started: the node's emulated dcgmi script is written to a temporary directory and run as
the prolog would run it (argv, timeout cut to the budget).  Writes bench/results/preflight.json.  What it
measures is the pre-flight's own cost (process start, r1's JSON, parsing), not DCGM's r1 on real GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testbed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

from clusterctl.healthd.config import HealthdConfig  # noqa: E402
from clusterctl.healthd.diagnostic_runner import run_diagnostic  # noqa: E402
from clusterctl.healthd.diagnostics import DiagnosticSpec, Diagnostics  # noqa: E402
from clusterctl.prolog.run import PREFLIGHT_SHARE, preflight  # noqa: E402
from clusterctl_testbed.dcgmi_emu import write_dcgmi  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = write_dcgmi(Path(tmp) / "node1")
        spec = DiagnosticSpec((str(script), "diag", "-r", "1", "-j"), 60.0, "dcgmi")
        config = HealthdConfig(journal_dir=Path(tmp) / "lib", diagnostics=Diagnostics(preflight=spec, source="bench"))
        budget = config.hook_timeout * PREFLIGHT_SHARE
        times = []
        for run in range(args.runs):
            began = time.perf_counter()
            problem = preflight(config, str(run), run_diagnostic, budget)
            times.append(time.perf_counter() - began)
            if problem is not None:
                raise SystemExit(f"the pre-flight failed on a healthy emulated node: {problem.describe()}")
    report = {"runs": args.runs, "budget_s": budget, "p50_s": round(statistics.median(times), 4),
              "p99_s": round(percentile(times, 99), 4), "max_s": round(max(times), 4)}
    out = Path(__file__).resolve().parent / "results" / "preflight.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
