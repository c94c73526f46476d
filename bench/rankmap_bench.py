"""Benchmark rank-map planning: time and peak memory from 1k to 100k GPUs, and quality.

    .venv/bin/python bench/rankmap_bench.py            # all sizes, quality table
    .venv/bin/python bench/rankmap_bench.py --one 100000

Cluster: a 3-level tree (32 nodes per leaf, 16 leaves per aggregation switch, one core),
1.3x larger than the job; the job's nodes are a random (seeded) fragmented subset.
Each size runs in a fresh process so its peak RSS is its own.  Writes bench/results/rankmap.json.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.launcher.pure.parallel import ParallelLayout  # noqa: E402
from clusterctl.launcher.pure.placement import plan  # noqa: E402
from clusterctl.slurm.topology import parse_topology_conf  # noqa: E402

GPN = 8


def cluster(nodes: int) -> tuple[str, list[str]]:
    leaves = -(-nodes // 32)
    lines = [f"SwitchName=l{i} Nodes=n[{i * 32 + 1}-{i * 32 + 32}]" for i in range(leaves)]
    aggs = -(-leaves // 16)
    for a in range(aggs):
        lines.append(f"SwitchName=a{a} Switches=l[{a * 16}-{min(a * 16 + 15, leaves - 1)}]")
    lines.append(f"SwitchName=core Switches=a[0-{aggs - 1}]")
    return "\n".join(lines), [f"n{i}" for i in range(1, leaves * 32 + 1)]


def case(gpus: int, seed: int = 0) -> tuple[ParallelLayout, object, list[str]]:
    job_nodes = gpus // GPN
    pp = 10 if job_nodes % 10 == 0 else 4 if job_nodes % 4 == 0 else 1
    layout = ParallelLayout(tp=8, pp=pp, dp=job_nodes // pp)
    text, all_nodes = cluster(int(job_nodes * 1.3) + 32)
    topo = parse_topology_conf(text)
    allocated = random.Random(seed).sample(all_nodes, job_nodes)
    return layout, topo, allocated


def one(gpus: int) -> dict:
    layout, topo, allocated = case(gpus)
    started = time.perf_counter()
    result = plan(layout, GPN, topo, allocated)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"gpus": gpus, "nodes": len(allocated), "layout": f"tp8 pp{layout.pp} dp{layout.dp}",
            "seconds": round(seconds, 3), "peak_rss_mb": round(peak_mb, 1), "strategy": result.strategy,
            "leaf_crossing_dp_pp": {"plan": result.cost.leaf_crossing_groups(),
                                    "slurm": result.baselines["slurm"].leaf_crossing_groups(),
                                    "dfs": result.baselines["dfs"].leaf_crossing_groups()},
            "objective": {"plan": result.cost.objective, "slurm": result.baselines["slurm"].objective,
                          "dfs": result.baselines["dfs"].objective}}


def quality(seeds: int) -> list[dict]:
    """Fragmented allocations on a 16-leaf cluster: leaf-crossing DP+PP groups, plan vs baselines."""
    rows = []
    lines = [f"SwitchName=l{i} Nodes=n[{i * 16 + 1}-{i * 16 + 16}]" for i in range(16)] + [
        "SwitchName=spine Switches=l[0-15]"]
    topo = parse_topology_conf("\n".join(lines))
    for seed in range(seeds):
        rng = random.Random(seed)
        for layout in (ParallelLayout(tp=8, pp=4, dp=16), ParallelLayout(tp=8, pp=8, dp=8),
                       ParallelLayout(tp=4, pp=4, dp=32)):
            nodes = layout.world_size // GPN
            free = [f"n{leaf * 16 + i}" for leaf in range(16) for i in sorted(rng.sample(range(1, 17),
                                                                                          rng.randint(3, 10)))]
            if len(free) < nodes:
                continue
            allocated = sorted(rng.sample(free, nodes))
            r = plan(layout, GPN, topo, allocated)
            s, d, p = (r.baselines["slurm"].leaf_crossing_groups(), r.baselines["dfs"].leaf_crossing_groups(),
                       r.cost.leaf_crossing_groups())
            rows.append({"seed": seed, "layout": f"tp{layout.tp} pp{layout.pp} dp{layout.dp}", "slurm": s, "dfs": d,
                         "plan": p, "fewer_than_slurm": round(1 - p / s, 3) if s else 0.0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", type=int, help="Plan one size in this process and print JSON.")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    sizes = []
    for gpus in (1_000, 4_000, 16_000, 64_000, 100_000):
        out = subprocess.run([sys.executable, __file__, "--one", str(gpus)], capture_output=True, text=True,
                             check=True)
        sizes.append(json.loads(out.stdout))
        r = sizes[-1]
        print(f"{r['gpus']:>7} GPUs ({r['layout']:>18}): {r['seconds']:6.3f} s, peak RSS {r['peak_rss_mb']:6.1f} MB, "
              f"leaf-crossing DP+PP plan {r['leaf_crossing_dp_pp']['plan']} / slurm "
              f"{r['leaf_crossing_dp_pp']['slurm']} / dfs {r['leaf_crossing_dp_pp']['dfs']}")
    rows = quality(args.seeds)
    worst = min(r["fewer_than_slurm"] for r in rows)
    mean = sum(r["fewer_than_slurm"] for r in rows) / len(rows)
    print(f"fragmented allocations ({len(rows)} cases): leaf-crossing DP+PP groups vs Slurm's order: "
          f"mean {mean:.0%} fewer, worst {worst:.0%} fewer")
    for r in rows:
        print(f"  seed {r['seed']} {r['layout']:>16}: slurm {r['slurm']:>4}  dfs {r['dfs']:>4}  plan {r['plan']:>4}"
              f"  ({r['fewer_than_slurm']:.0%} fewer)")
    out = Path(__file__).resolve().parent / "results" / "rankmap.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"sizes": sizes, "quality": rows}, indent=2))


if __name__ == "__main__":
    main()
