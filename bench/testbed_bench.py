"""Benchmark the testbed: bring-up and teardown time, and NVML event latency across hosts.

    sudo .venv/bin/python bench/testbed_bench.py [--cycles 3] [--events 200]

Uses its own testbed (/tmp/ctb-bench, namespaces ctbb-*), so a running one is left alone.
Prints a table and writes bench/results/testbed.json.
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
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402

LAYOUT = Layout(root=Path("/tmp/ctb-bench"), namespace_prefix="ctbb-")

WAITER = """
import sys, time, pynvml as n
n.nvmlInit()
es = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    n.nvmlDeviceRegisterEvents(h, n.nvmlDeviceGetSupportedEventTypes(h), es)
print("ready", flush=True)
for _ in range(int(sys.argv[1])):
    d = n.nvmlEventSetWait(es, 10000)
    print(time.time(), d.eventData, flush=True)
"""

CALL_COST = """
import time, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); k = 20000
t = time.perf_counter()
for _ in range(k): n.nvmlDeviceGetTemperature(h, 0)
print((time.perf_counter() - t) / k * 1e6)
"""



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()
    tb = Testbed(LAYOUT)
    ups, downs = [], []
    for _ in range(args.cycles):
        t = time.monotonic(); tb.up(timeout=90, slurm="host"); ups.append(time.monotonic() - t)
        t = time.monotonic(); tb.down(quiet=True); downs.append(time.monotonic() - t)
    tb.up(timeout=90, slurm="host")  # the figures in the README are this machine's Slurm
    try:
        job = time.monotonic()
        tb.run_on("ctl", ["srun", "-N4", "--ntasks-per-node=8", "true"], timeout=60)
        first_job = time.monotonic() - job

        waiter = subprocess.Popen([*tb.enter("node3"), sys.executable, "-c", WAITER, str(args.events)],
                                  stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "ready"
        latencies = []
        for i in range(args.events):
            sent = time.time()
            inject(tb.nvml_dir("node3"), Fault("xid", gpu=i % 8, value=13))
            received = float(waiter.stdout.readline().split()[0])
            latencies.append((received - sent) * 1000)
            time.sleep(0.01)
        waiter.wait(timeout=30)
        call_us = float(subprocess.run([*tb.enter("node3"), sys.executable, "-c", CALL_COST],
                                       capture_output=True, text=True, timeout=120).stdout)
    finally:
        tb.down(quiet=True)
    results = {
        "testbed_up_s": {"median": statistics.median(ups), "max": max(ups), "cycles": len(ups)},
        "testbed_down_s": {"median": statistics.median(downs), "max": max(downs)},
        "first_4x8_srun_s": first_job,
        "xid_inject_to_wait_ms": {"median": statistics.median(latencies), "p99": percentile(latencies, 0.99),
                                  "max": max(latencies), "events": len(latencies)},
        "pynvml_call_us": call_us,
    }
    out = Path(__file__).resolve().parent / "results" / "testbed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"testbed up            median {results['testbed_up_s']['median']:.2f} s, max {max(ups):.2f} s "
          f"({len(ups)} cycles)")
    print(f"testbed down          median {results['testbed_down_s']['median']:.2f} s, max {max(downs):.2f} s")
    print(f"first 4x8 srun        {first_job:.2f} s")
    print(f"Xid inject -> wait    median {results['xid_inject_to_wait_ms']['median']:.1f} ms, "
          f"p99 {results['xid_inject_to_wait_ms']['p99']:.1f} ms over {len(latencies)} events")
    print(f"pynvml call (emulated) {call_us:.1f} us")


if __name__ == "__main__":
    main()
