"""Benchmark healthd's periodic pass with the network, PCIe, NVLink-error and storage checks, without the testbed.

    .venv/bin/python bench/healthd_network_bench.py [--passes 200] [--trials 100]

One child process (LD_LIBRARY_PATH on the emulated libnvidia-ml.so.1: pynvml reads the library once per
process) runs healthd's own `PeriodicCheck.check` against 8 emulated GPUs (each read through NVML
under healthd's call door: PCIe width/generation and 18 links' NVLink error counters included), 8
emulated NDR ports (the testbed's sysfs tree) and one storage probe (write/fsync/read/unlink on a
local directory).  Slurm is not asked (a stub answers "not reachable"), so the figures are healthd's
own cost.

- idle: CPU seconds (every thread of the process) per pass, over --passes passes; as a share of one
  core at healthd's default 15 s interval, and the network+storage part alone;
- finding → drain decision: from the start of the pass that first reads a fault (a port down, symbol
  errors over their rate, a NIC PCIe downtrain) to the engine's planned drain, over --trials trials.
  The pass itself starts within one check interval of the fault (healthd polls sysfs; the kernel sends
  no event for these counters): add up to `check_interval` for the end-to-end figure.

Writes bench/results/healthd_network.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CHILD = textwrap.dedent("""
    import json, statistics, sys, tempfile, threading, time
    from pathlib import Path
    from clusterctl.clock import Clock
    from clusterctl.errors import SlurmCommandError
    from clusterctl.healthd import engine
    from clusterctl.healthd.checks.network import NicSample
    from clusterctl.healthd.config import HealthdConfig
    from clusterctl.healthd.nvml import Nvml, TimedCalls
    from clusterctl.healthd.periodic import PeriodicCheck
    from clusterctl.healthd.sampler import sample_host
    from clusterctl.healthd.state_writer import Heartbeats
    from clusterctl_testbed.ib_faults import IbFault, build_tree, inject_ib
    sys.path.insert(0, sys.argv[4])
    from stats import percentile

    passes, trials, root = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    fake_now = [1795305600.0]
    clock = Clock(now=lambda: fake_now[0], monotonic=time.monotonic)

    class NoSlurm:
        def state(self):
            raise SlurmCommandError("benchmark: no Slurm")

    def periodic(config, **kw):
        check = PeriodicCheck(config, nvml=Nvml(TimedCalls(5.0)), slurm=NoSlurm(), clock=clock,
                              host_sampler=sample_host, jitter=lambda a, b: 1.0, watching_node=lambda: False,
                              give_back_slot=lambda node, at: None, beats=Heartbeats(clock),
                              stop=threading.Event(), report=lambda observed: None, **kw)
        check.node_due = float("inf")
        return check

    def cpu_per_pass(check, n):
        for _ in range(3):
            fake_now[0] += 15
            check.check()
        start = time.process_time()
        wall = time.perf_counter()
        for _ in range(n):
            fake_now[0] += 15
            observed = check.check()
            assert not observed.findings, observed.findings
        return (time.process_time() - start) / n, (time.perf_counter() - wall) / n

    build_tree(root / "sysroot", 8)
    storage = root / "shared"
    storage.mkdir()
    full = HealthdConfig(ib_root=root / "sysroot", storage_paths=(str(storage),), disk_paths=("/",))
    bare = HealthdConfig(ib_root=root / "absent", disk_paths=("/",))
    with_all, with_all_wall = cpu_per_pass(periodic(full), passes)
    without, without_wall = cpu_per_pass(periodic(bare, nic_sampler=lambda c: NicSample()), passes)

    # The GPU side's new reads alone (PCIe link, 18 links' NVLink error counters), through the call door.
    from clusterctl.healthd.nvml import _nvlink_errors, _pcie_link
    door = Nvml(TimedCalls(5.0))
    door.init()
    door.discover()
    start = time.process_time()
    for _ in range(passes):
        for handle in door.handles.values():
            door.call("pcie", _pcie_link, handle)
            door.call("nvlink-errors", _nvlink_errors, handle, tuple(range(18)))
    new_nvml = (time.process_time() - start) / passes

    # Finding -> drain decision: each trial on a fresh node state, the fault injected after a clean pass.
    faults = [IbFault("ib-port-down", nic=1), IbFault("ib-symbol-errors", nic=2, value=1000),
              IbFault("nic-pcie-degraded", nic=3)]
    settings = engine.EngineSettings.from_config(full, "bench-node")
    latency = {f.kind: [] for f in faults}
    for i in range(trials):
        fault = faults[i % len(faults)]
        tree = root / f"trial{i}"
        build_tree(tree, 8)
        check = periodic(HealthdConfig(ib_root=tree, storage_paths=(str(storage),), disk_paths=("/",)))
        fake_now[0] += 15
        assert not check.check().findings
        fake_now[0] += 45  # symbol errors need reads 30 s apart to make a rate
        inject_ib(tree, fault)
        started = time.perf_counter()
        observed = check.check()
        step = engine.step(engine.EngineState(), settings, "periodic", observed.findings, fake_now[0])
        took = time.perf_counter() - started
        drains = [e for e in step.effects if isinstance(e, engine.Drain)]
        assert drains, (fault, observed.findings)
        latency[fault.kind].append(took)
        if i < len(faults):
            print("reason:", drains[0].planned.reason, file=sys.stderr)
    print(json.dumps({
        "idle": {"check_interval_s": 15.0, "gpus": 8, "nics": 8, "storage_paths": 1,
                 "cpu_s_per_pass": round(with_all, 5), "wall_s_per_pass": round(with_all_wall, 4),
                 "cpu_s_per_pass_without_network_and_storage": round(without, 5),
                 "cpu_percent_of_one_core_at_15s": round(with_all / 15 * 100, 3),
                 "network_and_storage_cpu_percent_at_15s": round((with_all - without) / 15 * 100, 3),
                 "new_gpu_reads_cpu_percent_at_15s": round(new_nvml / 15 * 100, 3)},
        "finding_to_drain_decision": {kind: {"median_s": round(statistics.median(v), 4),
                                             "p99_s": round(percentile(v, 0.99), 4), "trials": len(v)}
                                      for kind, v in latency.items()},
    }))
""")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--trials", type=int, default=99)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "testbed"))
    from clusterctl_testbed.cluster import build_nvml

    with tempfile.TemporaryDirectory(prefix="healthd-net-bench-") as tmp:
        root = Path(tmp)
        build_nvml(root / "lib" / "libnvidia-ml.so.1")
        node = root / "node"
        node.mkdir()
        (node / "events").touch()
        env = {**os.environ, "LD_LIBRARY_PATH": str(root / "lib"), "NVML_EMU_DIR": str(node),
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "testbed"), os.environ.get("PYTHONPATH", "")])}
        env.pop("NVML_EMU_ROOT", None)
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.passes), str(args.trials), str(root), str(HERE)],
                              env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{done.stderr}")
    sys.stderr.write(done.stderr)
    report = json.loads(done.stdout)
    out = HERE / "results" / "healthd_network.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    idle = report["idle"]
    print(f"periodic pass, 8 GPUs + 8 NICs + 1 storage path: {idle['cpu_s_per_pass'] * 1000:.1f} ms CPU "
          f"({idle['cpu_percent_of_one_core_at_15s']}% of one core at 15 s; network+storage "
          f"{idle['network_and_storage_cpu_percent_at_15s']}%, the GPUs' PCIe and NVLink-error reads "
          f"{idle['new_gpu_reads_cpu_percent_at_15s']}%)")
    for kind, r in report["finding_to_drain_decision"].items():
        print(f"{kind:18} pass that reads it → drain decision: median {r['median_s'] * 1000:.1f} ms, "
              f"p99 {r['p99_s'] * 1000:.1f} ms ({r['trials']} trials)")


if __name__ == "__main__":
    main()
