"""Benchmark the maps a shrink plans at fleet scale: the recovery judge's and the next step's (issue 43).

    .venv/bin/python bench/shrink_plan_bench.py                  # 12,512 nodes, 5 trials: bench/results/shrink_plan.json
    .venv/bin/python bench/shrink_plan_bench.py --nodes 1024 --trials 7

One node (n100) of a job on every node is lost, no spare is left, the batch host is n1.  A trial times,
in this process, what the agent's recovery plans: `plan_shrink` over the survivors (the judge), then the
step's map over the nodes the shrink keeps, the topology read again from its file as the step reads it:
"before" plans the step's map afresh (placement.plan_once without a planned map), "after" hands it the
judge's (`Shrink.planned`), which it takes only when planned from the same inputs.  The arms alternate.
Every "after" map is checked against the "before" map of the same case (plan_json, cost and explanation).

Cases (tp=8, 8 GPUs a node, leaves of 32 nodes as in plan_scale_bench.py):
- `pp4`: pp=4, dp=N/4 → N/4-1: 3 survivors are given back, so the step's nodes are not the judge's (no reuse);
- `pp1`: pp=1, dp=N → N-1: every survivor is kept, the step's nodes are the judge's (reuse).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_scale_bench import topology_conf  # noqa: E402
from stats import percentile  # noqa: E402

from clusterctl.launcher.pure.parallel import ParallelLayout, with_data_parallel  # noqa: E402
from clusterctl.launcher.pure.placement import plan_once  # noqa: E402
from clusterctl.launcher.pure.plan_document import plan_json  # noqa: E402
from clusterctl.launcher.pure.shrink import JobShape, Shrink, placement_weights, plan_shrink  # noqa: E402
from clusterctl.slurm import hostlist  # noqa: E402
from clusterctl.slurm.topology import load_topology  # noqa: E402


def trial(nodes: int, pp: int, topology_file: Path, reuse: bool) -> tuple[float, bool, dict]:
    """Seconds for the judge's and the step's plans; whether the step took the judge's; the step's plan."""
    topology = load_topology(topology_file)
    layout = ParallelLayout(tp=8, pp=pp, dp=nodes * 8 // (8 * pp))
    shape = JobShape(layout, layout.dp, 8, topology)
    survivors = [f"n{i}" for i in range(1, nodes + 1) if i != 100]
    start = time.perf_counter()
    shrink = plan_shrink(shape, survivors, "n1", 1)
    assert isinstance(shrink, Shrink), shrink
    step_topology = load_topology(topology_file)  # the step reads it again (job_topology)
    step = plan_once(with_data_parallel(layout, shrink.data_parallel), 8, step_topology,
                     hostlist.expand(hostlist.compress(list(shrink.nodes))), placement_weights(shape),
                     shrink.planned if reuse else None)
    took = time.perf_counter() - start
    return took, step is shrink.planned, plan_json(step.plan, step_topology)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=12_512)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "shrink_plan.json")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        topology_file = Path(tmp) / "topology.conf"
        topology_file.write_text(topology_conf(args.nodes))
        for case, pp in (("pp4", 4), ("pp1", 1)):
            times: dict[str, list[float]] = {"before": [], "after": []}
            reused, maps = set(), {}
            for _ in range(args.trials):
                for arm in ("before", "after"):
                    took, took_judges, document = trial(args.nodes, pp, topology_file, arm == "after")
                    times[arm].append(took)
                    maps.setdefault(arm, document)
                    if arm == "after":
                        reused.add(took_judges)
            assert maps["before"] == maps["after"], f"{case}: the step's map differs from a fresh plan"
            results[case] = {"reused": sorted(reused), **{
                arm: {"median": percentile(t, 0.5), "min": min(t), "max": max(t), "trials": t}
                for arm, t in times.items()}}
            for arm, t in times.items():
                print(f"{args.nodes} nodes {case} {arm}: {percentile(t, 0.5):.2f} s [{min(t):.2f}-{max(t):.2f}] "
                      f"(step took the judge's map: {sorted(reused) if arm == 'after' else [False]})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"nodes": args.nodes, "cases": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
