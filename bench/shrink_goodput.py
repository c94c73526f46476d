"""Goodput over a simulated day of the seeds' cluster: shrink+grow against spares-then-resubmit and resubmit-only.

    .venv/bin/python bench/shrink_goodput.py                        # 0.5 h and 4 h queues, 0/4/16 spares, 10 seeds
    .venv/bin/python bench/shrink_goodput.py --queue-hours 0.5 --spares 8 --seeds 20
    .venv/bin/python bench/shrink_goodput.py --checkpoint-stall 14.29   # today's synchronous save instead

The model is launcher/pure/fleet_goodput.py (a seeded discrete-event simulation; its docstring says what it
counts and how).  One job of 12,500 nodes × 8 GPUs over 24 h; each seed draws one day of failures, and every
policy meets the same failures on that seed.  Each figure is the median [min–max] over the seeds.  Goodput is
the share of the job's nominal node-hours (12,500 × 24) spent on training a checkpoint kept; what is not is
time lost (checkpoint stalls, work redone, restarts, the queue) or capacity lost (running with replicas
dropped).  Spares are outside the nominal size; their idle node-hours are reported apart.

Where each parameter comes from (docs/measured.md; the testbed: 2 cores, Slurm 22.05, its default timeouts
300/10/30 s unless said):

- recovery in the allocation (a spare swapped in, a replica dropped or grown back): **9.17 s**, a node's link
  cut → rank 0 steps again, Slurm's defaults ("A node gone without a word"); Xid 79 is 3.97 s there, a node
  powered off 8.06 s: the slowest of the three is taken for every node.
- the batch host lost: **443.7 s**, its standby takes over once Slurm declares it DOWN, Slurm's defaults ("The
  batch host dies ... under Slurm's default timeouts"); a resubmission waits for the same DOWN, so either path
  costs at least that.  One failure in (working nodes) is the batch host's.
- resubmission, fault → stepping again with no queue: **26.5 s**, Xid 79 by resubmission, Slurm's defaults
  ("Xid 79 by resubmission").  The testbed's busy queue (48.0 s against 6.44 s idle, "Recovery inside the
  allocation against resubmission") is a 4-node queue behind one 45 s job: not a real cluster's.
- checkpoint stall: **1.25 s**, multi-level checkpoints, 1 GB a node, shared storage at 0.1 GB/s (bench/README,
  "Multi-level checkpoints against today's synchronous save"); today's synchronous save stalls 14.29 s there.
  The interval is Young/Daly's sqrt(2 · stall · job MTBF) (launcher.pure.goodput.young_daly).

Assumed (options; none measured here):

- the queue wait of a resubmitted 12,500-node job on a busy cluster: 0.5 h and 4 h (`--queue-hours`);
- a grow request (a second allocation for the dropped replica's nodes) waits as long (`--grow-wait-hours`);
- the job sees a node failure every 1.5 h at full size (`--job-mtbf-hours`; Meta's Llama 3: ~1.8 h at 16k
  GPUs), a Poisson process at a rate proportional to its working nodes; spares held idle do not fail;
- repairs: lognormal, median 4 h, sigma 0.8 (`--repair-median-hours`, `--repair-sigma`); a repaired node does
  not return as a spare (clusterctl gives a failed node back to Slurm); a dropped replica is grown back at the
  first checkpoint after its failed node is repaired and the grow request has waited;
- a data-parallel replica is 20 nodes (tensor parallel 8 in a node × 20 pipeline stages; `--replica-nodes`);
  shrinking may go down to half the job (`--min-share`);
- starting 100,000 ranks takes no longer than the testbed's 16–24 (`--extra-start-seconds` adds a start-up
  time to every recovery, in the allocation or not).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusterctl.launcher.pure.fleet_goodput import (  # noqa: E402
    POLICIES, RESUBMIT, SHRINK, DayOfFailures, Fleet, FleetModelError, simulate)
from clusterctl.launcher.pure.goodput import young_daly  # noqa: E402
from peer_steps import spread  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "shrink_goodput.json"
HOUR = 3600.0
SOURCES = {
    "in_allocation_seconds": "measured: a node's link cut -> rank 0 steps again in the allocation, Slurm's default "
                             "timeouts, 9.17 s [8.27-9.48] (docs/measured.md, 'A node gone without a word')",
    "batch_host_recovery_seconds": "measured: the batch host powered off -> its standby steps again, Slurm's default "
                                   "timeouts, 443.7 s [417.8-487.0] (docs/measured.md, 'The batch host dies')",
    "resubmit_seconds": "measured: Xid 79 by resubmission, idle queue, Slurm's default timeouts, 26.5 s [21.7-47.7] "
                        "(docs/measured.md, 'Xid 79 by resubmission')",
    "checkpoint_stall_seconds": "measured: multi-level checkpoint stall, 1 GB a node, shared at 0.1 GB/s, 1.25 s "
                                "[1.04-1.31] (bench/README.md, checkpoint_bench.py)",
    "checkpoint_interval_seconds": "Young/Daly: sqrt(2 * stall * job MTBF)",
    "queue_seconds": "assumed: a busy cluster's queue wait for a resubmitted 12,500-node job",
    "grow_wait_seconds": "assumed: a grow request waits in the queue as long as a resubmission",
    "node_mtbf_seconds": "assumed: the job sees a failure every --job-mtbf-hours at full size (the issue: ~1.5 h)",
    "repair": "assumed: lognormal repair times",
    "replica_nodes": "assumed: TP 8 in a node x PP 20 stages",
}


@dataclass(frozen=True)
class Cell:
    """One policy at one queue wait and spare count: its days, one a seed."""

    queue_hours: float
    spares: int
    policy: str
    days: tuple[DayOfFailures, ...]


def fleet_from_args(args: argparse.Namespace) -> Fleet:
    """The job at its nominal size, every measured figure plus `--extra-start-seconds` of start-up."""
    nodes = args.nodes
    mtbf = args.job_mtbf_hours * HOUR
    extra = args.extra_start_seconds
    return Fleet(
        nodes=nodes, replica_nodes=args.replica_nodes, min_nodes=int(nodes * args.min_share),
        node_mtbf_seconds=mtbf * nodes, repair_median_seconds=args.repair_median_hours * HOUR,
        repair_sigma=args.repair_sigma, checkpoint_stall_seconds=args.checkpoint_stall,
        checkpoint_interval_seconds=young_daly(args.checkpoint_stall, mtbf) if args.checkpoint_stall > 0 else mtbf,
        in_allocation_seconds=args.in_allocation + extra, batch_host_recovery_seconds=args.batch_host + extra,
        resubmit_seconds=args.resubmit + extra, window_seconds=args.window_hours * HOUR)


def run(base: Fleet, queue_hours: list[float], spares: list[int], seeds: int,
        grow_wait_hours: float | None) -> list[Cell]:
    """Every policy at every queue wait and spare count (resubmit-only, which holds none, once per queue wait), on
    seeds 0..seeds-1: the same failures for each."""
    cells = []
    for queue in queue_hours:
        for spare in spares:
            fleet = replace(base, queue_seconds=queue * HOUR, spares=spare,
                            grow_wait_seconds=None if grow_wait_hours is None else grow_wait_hours * HOUR)
            for policy in POLICIES:
                if policy == RESUBMIT and spare != spares[0]:
                    continue  # holds no spares: one row per queue wait
                days = tuple(simulate(fleet, policy, random.Random(seed)) for seed in range(seeds))
                cells.append(Cell(queue, spare, policy, days))
    return cells


def percent(values: list[float]) -> str:
    """median [min–max] in per cent."""
    return spread([round(100 * v, 2) for v in values]) + " %"


def table(cells: list[Cell]) -> str:
    lines = ["| queue wait | spares | policy | **goodput** | time lost | of which queue | capacity lost "
             "| failures | resubmissions | shrinks / grows |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cell in cells:
        days = cell.days
        moves = (f"{spread([d.shrinks for d in days])} / {spread([d.grows for d in days])}"
                 if cell.policy == SHRINK else "")
        lines.append(
            f"| {cell.queue_hours:g} h | {'—' if cell.policy == RESUBMIT else cell.spares} | {cell.policy} | **{percent([d.goodput for d in days])}** "
            f"| {percent([d.time_lost_share for d in days])} | {percent([d.queue_share for d in days])} "
            f"| {percent([d.capacity_share for d in days])} | {spread([d.failures for d in days])} "
            f"| {spread([d.resubmissions for d in days])} | {moves} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Goodput of a simulated day: shrink+grow, spares-then-resubmit, "
                                            "resubmit-only.")
    p.add_argument("--queue-hours", type=float, action="append", help="queue waits to compare (default 0.5 and 4)")
    p.add_argument("--spares", type=int, action="append", help="spare counts to compare (default 0, 4 and 16)")
    p.add_argument("--seeds", type=int, default=10, help="days simulated per cell (default 10; at least 5)")
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--replica-nodes", type=int, default=20)
    p.add_argument("--min-share", type=float, default=0.5, help="shrink no smaller than this share of the job")
    p.add_argument("--job-mtbf-hours", type=float, default=1.5)
    p.add_argument("--repair-median-hours", type=float, default=4.0)
    p.add_argument("--repair-sigma", type=float, default=0.8)
    p.add_argument("--grow-wait-hours", type=float, help="a grow request's queue wait (default: the queue wait)")
    p.add_argument("--window-hours", type=float, default=24.0)
    p.add_argument("--checkpoint-stall", type=float, default=1.25, help="seconds (measured: 1.25 multi-level, "
                                                                        "14.29 today's synchronous save)")
    p.add_argument("--in-allocation", type=float, default=9.17, help="seconds (measured)")
    p.add_argument("--batch-host", type=float, default=443.7, help="seconds (measured)")
    p.add_argument("--resubmit", type=float, default=26.5, help="seconds with no queue wait (measured)")
    p.add_argument("--extra-start-seconds", type=float, default=0.0,
                   help="added to every recovery: starting 100,000 ranks against the testbed's 16-24")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.seeds < 5:
        p.error("--seeds must be at least 5 (a median [min-max] of fewer says little)")
    if not 0 <= args.min_share <= 1:
        p.error("--min-share is a share of the job: between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        base = fleet_from_args(args)
        started = time.perf_counter()
        cells = run(base, args.queue_hours or [0.5, 4.0], args.spares or [0, 4, 16], args.seeds,
                    args.grow_wait_hours)
        took = time.perf_counter() - started
    except FleetModelError as error:
        raise SystemExit(f"shrink_goodput: {error}") from None
    days = sum(len(c.days) for c in cells)
    print(f"{base.nodes:,} nodes, one failure every {base.job_mtbf_seconds / HOUR:g} h at full size, "
          f"{base.window_seconds / HOUR:g} h simulated, {args.seeds} seeds; checkpoint every "
          f"{base.checkpoint_interval_seconds:.0f} s of training, stall {base.checkpoint_stall_seconds:g} s; "
          f"recovery in the allocation {base.in_allocation_seconds:g} s, batch host {base.batch_host_recovery_seconds:g} s, "
          f"resubmission {base.resubmit_seconds:g} s + the queue; replicas of {base.replica_nodes} nodes, "
          f"repairs lognormal (median {args.repair_median_hours:g} h, sigma {base.repair_sigma:g})")
    print("where each default comes from:")
    for name, source in SOURCES.items():
        print(f"  {name}: {source}")
    print(f"{days} simulated days in {took:.2f} s ({took / days * 1e3:.2f} ms a day)\n")
    print(table(cells))
    result: dict[str, Any] = {
        "command": " ".join(["bench/shrink_goodput.py", *(argv if argv is not None else sys.argv[1:])]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
        "fleet": asdict(base), "sources": SOURCES, "seconds_per_day_simulated": took / days,
        "cells": [{"queue_hours": c.queue_hours, "spares": c.spares, "policy": c.policy,
                   "days": [asdict(d) for d in c.days]} for c in cells],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
