"""Project the share of time a large job spends training, today's checkpoints against multi-level ones.

    .venv/bin/python bench/checkpoint_goodput.py                       # costs from bench/results/checkpoint.json
    .venv/bin/python bench/checkpoint_goodput.py --rate-gbps 0.1       # that run of the bench
    .venv/bin/python bench/checkpoint_goodput.py --sync-stall 20 --sync-read 20 --tiered-stall 1 \\
        --local-read 4 --replicate 10 --flush 20                        # costs given by hand

The model is launcher/pure/goodput_model.py (first-order Young/Daly, the recovery split by where a
resume reads from; its docstring has the formula).  Costs per checkpoint come from
bench/checkpoint_bench.py's medians at one shared-storage rate (`--rate-gbps`, default the first run
in the file): today's stall and read are the synchronous save and the read back from shared storage;
the new path's are its stall, the replacement node's read (local + buddy: the slowest node), the
replicate and flush lags and the background slowdown; a failure that takes a node and its buddy
reads from shared storage as today.  `--state-gb` scales every measured cost linearly from the
bench's state size to another per-node size (an approximation: fixed overheads scale too).

Detection and restart are not measured here: `--detect-seconds` (default 30: a hang found by a
collective's timeout or the hang watch; healthd's Xid path is under a second) and
`--restart-seconds` (default 120: a new step of 10,000+ nodes importing, rendezvousing, and building
its communicators; the testbed's 2 s is for 16 ranks).  The node MTBF is Llama 3's (419 interruptions
in 54 days on 2,048 nodes of 8) unless `--node-mtbf-days` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.launcher.pure.goodput_model import (  # noqa: E402
    LLAMA3_NODE_MTBF_SECONDS, Job, Projection, SyncPath, TieredPath, project_sync, project_tiered)

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint.json"
SIZES = (1_250, 12_500)


@dataclass(frozen=True)
class Costs:
    """Seconds per checkpoint and per resume, for both paths, and where they came from."""

    sync: SyncPath
    tiered: TieredPath
    source: str


def costs_from_results(result: dict[str, Any], rate_gbps: float | None, flush_every: int,
                       state_gb: float | None) -> Costs:
    """The medians of one run of checkpoint_bench.py (the first, or the one at `rate_gbps`)."""
    runs = result["runs"]
    chosen = runs[0] if rate_gbps is None else next(
        (r for r in runs if abs(r["shared_rate_bytes_per_second"] - rate_gbps * 1e9) < 1), None)
    if chosen is None:
        rates = ", ".join(f"{r['shared_rate_bytes_per_second'] / 1e9:g}" for r in runs)
        raise SystemExit(f"checkpoint_goodput: no run at {rate_gbps} GB/s in the results (there are: {rates})")
    scale = 1.0 if state_gb is None else state_gb * 1e9 / result["state_bytes"]

    def median(key: str) -> float:
        return float(chosen["figures"][key]["median"]) * scale

    sync = SyncPath(stall_seconds=median("sync_stall_s"), read_seconds=median("sync_read_s"))
    tiered = TieredPath(stall_seconds=median("tiered_stall_s"), local_read_seconds=median("replacement_read_s"),
                        shared_read_seconds=median("sync_read_s"), replicate_seconds=median("replicate_s"),
                        flush_seconds=median("flush_s"), flush_every=flush_every,
                        background_slowdown=float(chosen["figures"]["background_slowdown"]["median"]))
    gb = result["state_bytes"] / 1e9 * scale
    rate = chosen["shared_rate_bytes_per_second"] / 1e9
    scaled = f", scaled x{scale:g} to {gb:g} GB per node" if scale != 1.0 else f", {gb:g} GB per node"
    return Costs(sync, tiered, f"checkpoint_bench medians, shared storage at {rate:g} GB/s, new path "
                               f"{chosen['new_path']}{scaled}")


def projections(costs: Costs, job: Job, sizes: tuple[int, ...] = SIZES) -> list[tuple[int, Projection, Projection]]:
    """(nodes, today, new) for each job size."""
    rows = []
    for nodes in sizes:
        sized = Job(nodes=nodes, detect_seconds=job.detect_seconds, restart_seconds=job.restart_seconds,
                    node_mtbf_seconds=job.node_mtbf_seconds, correlated_pair_loss=job.correlated_pair_loss,
                    shortest_interval_seconds=job.shortest_interval_seconds)
        rows.append((nodes, project_sync(sized, costs.sync), project_tiered(sized, costs.tiered)))
    return rows


def table(costs: Costs, job: Job, rows: list[tuple[int, Projection, Projection]]) -> str:
    s, t = costs.sync, costs.tiered
    lines = [
        f"costs: {costs.source}",
        f"today: stall {s.stall_seconds:.3f} s, read {s.read_seconds:.3f} s; new: stall {t.stall_seconds:.3f} s, "
        f"read (local + buddy) {t.local_read_seconds:.3f} s, from shared {t.shared_read_seconds:.3f} s, buddy copy "
        f"after {t.replicate_seconds:.3f} s, flush after {t.flush_seconds:.3f} s (every {t.flush_every}th), "
        f"background slowdown {t.background_slowdown:.1%}",
        f"failures: node MTBF {job.node_mtbf_seconds / 86_400:.0f} days, detection {job.detect_seconds:g} s, "
        f"restart {job.restart_seconds:g} s, correlated pair loss {job.correlated_pair_loss:g}",
        "",
        "| nodes | job MTBF | path | training between checkpoints | a checkpoint to shared every | lost work / failure | recovery / failure "
        "| P(read from shared) | time training |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for nodes, today, new in rows:
        for label, p in (("today", today), ("new", new)):
            lines.append(f"| {nodes:,} | {p.job_mtbf_seconds / 60:.1f} min | {label} | {p.interval_seconds:.1f} s "
                         f"| {p.flush_interval_seconds:.1f} s | {p.lost_work_seconds:.1f} s | {p.recovery_seconds:.1f} s "
                         f"| {1.0 if label == 'today' else p.pair_loss:.2g} | **{p.goodput:.1%}** |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Goodput projection, today's checkpoints against multi-level ones.")
    p.add_argument("--results", type=Path, default=RESULTS, help="checkpoint_bench.py's output")
    p.add_argument("--rate-gbps", type=float, help="which run of the results (default: the first)")
    p.add_argument("--state-gb", type=float, help="scale the measured costs to this many GB per node")
    p.add_argument("--flush-every", type=int, default=10, help="every k-th checkpoint flushed (default 10)")
    p.add_argument("--nodes", type=int, action="append", help=f"job sizes (default {SIZES})")
    p.add_argument("--detect-seconds", type=float, default=30.0)
    p.add_argument("--restart-seconds", type=float, default=120.0)
    p.add_argument("--node-mtbf-days", type=float, default=LLAMA3_NODE_MTBF_SECONDS / 86_400)
    p.add_argument("--correlated-pair-loss", type=float, default=0.0,
                   help="share of failures that take a node and its buddy together whatever the timing")
    for name in ("sync-stall", "sync-read", "tiered-stall", "local-read", "replicate", "flush", "slowdown"):
        p.add_argument(f"--{name}", type=float, help="a cost given by hand (seconds; slowdown a share)")
    args = p.parse_args(argv)
    if args.flush_every < 1:
        p.error("--flush-every must be at least 1")
    return args


def costs_from_args(args: argparse.Namespace) -> Costs:
    """By hand when --sync-stall, --sync-read, --tiered-stall and --local-read are all given, else from the results."""
    by_hand = (args.sync_stall, args.sync_read, args.tiered_stall, args.local_read)
    if all(v is not None for v in by_hand):
        return Costs(SyncPath(args.sync_stall, args.sync_read),
                     TieredPath(args.tiered_stall, args.local_read, args.sync_read, args.replicate or 0.0,
                                args.flush or 0.0, args.flush_every, args.slowdown or 0.0), "given by hand")
    if any(v is not None for v in by_hand):
        raise SystemExit("checkpoint_goodput: give all of --sync-stall, --sync-read, --tiered-stall and --local-read, "
                         "or none (then the costs come from --results)")
    if not args.results.is_file():
        raise SystemExit(f"checkpoint_goodput: {args.results} is missing: run bench/checkpoint_bench.py first, "
                         "or give the costs by hand")
    return costs_from_results(json.loads(args.results.read_text()), args.rate_gbps, args.flush_every, args.state_gb)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    costs = costs_from_args(args)
    job = Job(nodes=1, detect_seconds=args.detect_seconds, restart_seconds=args.restart_seconds,
              node_mtbf_seconds=args.node_mtbf_days * 86_400, correlated_pair_loss=args.correlated_pair_loss)
    print(table(costs, job, projections(costs, job, tuple(args.nodes or SIZES))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
