"""Benchmark healthd on the testbed: fault → node shows DRAIN in sinfo, and steady-state cost.

    sudo .venv/bin/python bench/healthd_bench.py [--trials 50] [--idle 60]

Three paths, each over --trials injections (rotating nodes, GPUs and Xids so no trial is a
duplicate the daemon would rightly suppress): an NVML Xid event, a kernel-log Xid line with
no NVML event, and a periodic-check finding (an NVLink link down: no event, no log line).
Latency is measured from just before the injection to the first `sinfo` showing the node
drained (sinfo polled every ~10 ms from the controller host).  Then --idle seconds with no
fault, at healthd's default 15 s check interval (set by SIGHUP reload): CPU share and RSS.
The CPU figure includes the emulated driver's own polling for events (a real driver blocks
in the kernel instead), so it is an upper bound.  Uses its own testbed (/tmp/ctb-bench).
Writes bench/results/healthd.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

from clusterctl_testbed.cluster import Testbed  # noqa: E402
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402

LAYOUT = Layout(root=Path("/tmp/ctb-bench"), namespace_prefix="ctbb-")
DRAIN_XIDS = (48, 62, 95, 109, 110, 119, 120, 136, 143)
STEADY_INTERVAL = 15.0

POLLER = """
import subprocess, sys, time
node = sys.argv[1]
print("ready", flush=True)
for line in sys.stdin:
    deadline = time.time() + 15
    while True:
        out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout
        if out.strip().startswith("drain"):
            print(time.time(), flush=True)
            break
        if time.time() > deadline:
            print("missed", flush=True)
            break
        time.sleep(0.01)
"""



def resume(tb: Testbed, node: str) -> None:
    inject(tb.nvml_dir(node), Fault("clear"))
    tb.run_on("ctl", ["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    tb.wait_nodes_idle(nodes=[node], timeout=30)


def measure(tb: Testbed, pollers: dict, node: str, fault: Fault) -> float:
    poller = pollers[node]
    sent = time.time()
    inject(tb.nvml_dir(node), fault)
    poller.stdin.write("go\n")
    poller.stdin.flush()
    answer = poller.stdout.readline().strip()
    if answer == "missed":
        raise SystemExit(f"{fault} on {node}: not drained within 15 s")
    return float(answer) - sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--idle", type=float, default=60)
    parser.add_argument("--steady-only", action="store_true", help="Skip the latency trials.")
    args = parser.parse_args()
    tb = Testbed(LAYOUT)
    tb.up(timeout=90, slurm="host")  # the figures in the README are this machine's Slurm
    nodes = list(LAYOUT.nodes)
    pollers = {}
    try:
        for node in nodes:
            p = subprocess.Popen([*tb.enter("ctl"), sys.executable, "-c", POLLER, node], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            pollers[node] = p
        results: dict[str, list[float]] = {"xid-event": [], "kernel-log": [], "periodic": []}
        # An "xid" injection also writes its kernel-log line, so the two paths use disjoint Xids:
        # a repeat of one (GPU, Xid) inside the dedup window is rightly not acted on again.
        event_combos = [(gpu, xid) for xid in DRAIN_XIDS[:4] for gpu in range(8)]
        kmsg_combos = [(gpu, xid) for xid in DRAIN_XIDS[4:] for gpu in range(8)]
        for i in range(0 if args.steady_only else args.trials):
            node = nodes[i % len(nodes)]
            gpu, xid = event_combos[i // len(nodes) % len(event_combos)]
            results["xid-event"].append(measure(tb, pollers, node, Fault("xid", gpu=gpu, value=xid)))
            resume(tb, node)
            gpu, xid = kmsg_combos[i // len(nodes) % len(kmsg_combos)]
            results["kernel-log"].append(measure(tb, pollers, node, Fault("kmsg-xid", gpu=gpu, value=xid)))
            resume(tb, node)
        for i in range(0 if args.steady_only else args.trials):
            node = nodes[i % len(nodes)]
            time.sleep(LAYOUT.healthd_interval / len(nodes))  # let healthd see the node back in service
            results["periodic"].append(measure(tb, pollers, node, Fault("nvlink-down", gpu=i % 8, value=i % 18)))
            resume(tb, node)
        # Steady state at healthd's default check interval (15 s): rewrite each node's config and
        # SIGHUP the daemons (the reload path a site uses), then watch them idle.
        for n in nodes:
            conf = LAYOUT.host_dir(n) / "etc-clusterctl" / "healthd.toml"
            conf.write_text(conf.read_text().replace(f"check_interval = {LAYOUT.healthd_interval}",
                                                     f"check_interval = {STEADY_INTERVAL}"))
            psutil.Process(tb._pids()[f"healthd:{n}"]).send_signal(signal.SIGHUP)
        time.sleep(STEADY_INTERVAL + 2)
        procs = [psutil.Process(tb._pids()[f"healthd:{n}"]) for n in nodes]
        before = [p.cpu_times() for p in procs]
        time.sleep(args.idle)
        after = [p.cpu_times() for p in procs]
        cpu = [((a.user + a.system) - (b.user + b.system)) / args.idle * 100 for a, b in zip(after, before)]
        rss = [p.memory_info().rss / 2**20 for p in procs]
    finally:
        for p in pollers.values():
            p.kill()
        tb.down(quiet=True)
    report = {} if args.steady_only else {path: {"median_s": round(statistics.median(v), 3), "p99_s": round(percentile(v, 0.99), 3),
                     "max_s": round(max(v), 3), "trials": len(v)} for path, v in results.items()}
    report["steady_state"] = {"check_interval_s": STEADY_INTERVAL, "gpus": 8,
                              "cpu_percent_of_one_core": {"max": round(max(cpu), 3), "mean": round(statistics.mean(cpu), 3)},
                              "rss_mb": {"max": round(max(rss), 1)}}
    out = Path(__file__).resolve().parent / "results" / "healthd.json"
    out.parent.mkdir(exist_ok=True)
    if args.steady_only and out.exists():  # keep the latency figures of the last full run
        report = {**json.loads(out.read_text()), "steady_state": report["steady_state"]}
    out.write_text(json.dumps(report, indent=2))
    for path in () if args.steady_only else ("xid-event", "kernel-log", "periodic"):
        r = report[path]
        print(f"{path:11} fault → DRAIN in sinfo: median {r['median_s']:.3f} s, p99 {r['p99_s']:.3f} s, "
              f"max {r['max_s']:.3f} s ({r['trials']} trials)")
    s = report["steady_state"]
    print(f"steady state (8 GPUs, checks every {s['check_interval_s']:g} s): CPU {s['cpu_percent_of_one_core']['max']}% "
          f"of one core (max over nodes), RSS {s['rss_mb']['max']} MB")


if __name__ == "__main__":
    main()
