"""Benchmark the straggler watch: how soon it finds a slow node, and how often it flags a healthy one.

    .venv/bin/python bench/straggler_bench.py [--trials 5] [--nodes 32] [--steps 20000]

Pure simulation of the ranks' progress records (no Slurm): `--nodes` nodes x 8 ranks, each rank's
compute time per step 0.2 s x its node's own speed (each node within +-3% of the others, for good)
x per-step noise (lognormal, sigma 5%) x rare hiccups (0.5% of steps take 3x: a garbage collection,
a slow data load); every 1000-3000 steps the whole job slows 1.5-3x for 50-300 steps (a
shared-filesystem stall); each node has short blips (1.5-4x for 5-25 steps) about once per 5000
steps.  The watch (the spec's defaults: margin 1.2, window 30 steps, warm-up 10) reads every rank's
record every 4 steps, as the agent's node reads do (every 2 s at 0.5 s a step).

- false positives: noise-only runs of `--steps` steps; nodes flagged per million node-steps;
- detection delay: the same noise plus one node slowed by a factor (1.3x, 1.5x, 2x, 3x) from a
  random step on; steps from onset to the watch's finding (and whether the right node was found).

- the rank's side: what one `clusterctl.progress.beat(step, compute_seconds=...)` costs the training
  loop (a million calls a trial; at most one a second writes its file, the rest only add to the sums),
  and with the training metrics too (`tokens=`, `flops=`, `loss=`, `grad_norm=`: Python numbers, and
  with --tensors PyTorch scalars as a training loop holds them, detached at each call and read once
  per report), against a 100 ms step.  Each trial is a fresh process; the variants alternate within
  each trial (a busy machine slows them alike); `--old CHECKOUT` adds the plain call of another
  checkout (today's code) beside them.  `--beat-only` measures just this (about a minute).

Median and min-max over `--trials` trials (different seeds).  Writes bench/results/straggler.json.

    .venv/bin/python bench/straggler_bench.py --beat-only --trials 7 --tensors --old /tmp/old
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.launcher.pure.straggler_watch import StragglerPolicy, StragglerWatch  # noqa: E402
from clusterctl.records.rank_progress import RankProgress  # noqa: E402

RANKS_PER_NODE = 8
STEP = 0.2
READ_EVERY = 4
FACTORS = (1.3, 1.5, 2.0, 3.0)


def simulate(seed: int, nodes: int, steps: int, slow: tuple[int, int, float] | None) -> dict:
    """One run; `slow` = (node, onset step, factor) or None.  Returns what the watch found and when."""
    rng = random.Random(seed)
    speed = [rng.uniform(0.97, 1.03) for _ in range(nodes)]
    job_slow: dict[int, float] = {}
    step = rng.randint(1000, 3000)
    while step < steps:
        length, factor = rng.randint(50, 300), rng.uniform(1.5, 3.0)
        job_slow.update({s: factor for s in range(step, step + length)})
        step += length + rng.randint(1000, 3000)
    blips: dict[tuple[int, int], float] = {}
    for node in range(nodes):
        for _ in range(max(1, steps // 5000)):
            start, length, factor = rng.randint(1, steps), rng.randint(5, 25), rng.uniform(1.5, 4.0)
            blips.update({(node, s): factor for s in range(start, start + length)})
    watch = StragglerWatch.start(StragglerPolicy())
    totals = [0.0] * (nodes * RANKS_PER_NODE)
    found: list[tuple[int, int]] = []
    for step in range(1, steps + 1):
        whole = job_slow.get(step, 1.0)
        for node in range(nodes):
            base = STEP * speed[node] * whole * blips.get((node, step), 1.0)
            if slow is not None and node == slow[0] and step >= slow[1]:
                base *= slow[2]
            for local in range(RANKS_PER_NODE):
                hiccup = 3.0 if rng.random() < 0.005 else 1.0
                totals[node * RANKS_PER_NODE + local] += base * hiccup * math.exp(rng.gauss(0, 0.05))
        if step % READ_EVERY == 0:
            records = [RankProgress(rank, f"node{rank // RANKS_PER_NODE}", step, "step", float(step), 1,
                                    totals[rank], step) for rank in range(len(totals))]
            watch = watch.observe(records)
            found += [(step, int(s.node.removeprefix("node"))) for s in watch.found]
    return {"found": found}


BEAT_PROGRAM = """
import os, sys, tempfile, time
sys.path.insert(0, {checkout!r})
from clusterctl.progress import beat
variant, calls = {variant!r}, {calls}
loss = grad_norm = None
if variant == "tensors":  # a loss and a norm as a training loop holds them (CPU scalars here)
    import torch
    loss, grad_norm = torch.tensor(2.5, requires_grad=True) * 1.0, torch.tensor(0.8)
with tempfile.TemporaryDirectory() as job_dir:
    os.environ.update({{"CLUSTERCTL_JOB_DIR": job_dir, "RANK": "0"}})
    started = time.perf_counter()
    if variant == "plain":
        for step in range(calls):
            beat(step, compute_seconds=0.1)
    elif variant == "metrics":
        for step in range(calls):
            beat(step, compute_seconds=0.1, tokens=4096, flops=2.4e13, loss=2.5, grad_norm=0.8)
    else:
        for step in range(calls):
            beat(step, compute_seconds=0.1, tokens=4096, flops=2.4e13, loss=loss, grad_norm=grad_norm)
    print((time.perf_counter() - started) / calls * 1e9)
"""
BEAT_VARIANTS = {
    "plain": "beat(step, compute_seconds=...): today's call",
    "metrics": "... + tokens=, flops=, loss=, grad_norm= (Python numbers)",
    "tensors": "... + loss= and grad_norm= as PyTorch scalars (detached each call, read once a report)",
}
STEP_NS = 100e6  # a 100 ms training step


def beat_trial(checkout: Path, variant: str, calls: int) -> float:
    """Nanoseconds per beat() call of `variant`, in a fresh process running `checkout`'s clusterctl."""
    import subprocess

    program = BEAT_PROGRAM.format(checkout=str(checkout), variant=variant, calls=calls)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"beat trial {variant} of {checkout} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip())


def beat_costs(trials: int, calls: int, tensors: bool, old: Path | None) -> dict:
    """Each trial: every variant (and the old checkout's plain call) once, in an order that turns each trial."""
    this = Path(__file__).resolve().parent.parent
    runs = [("new", this, v) for v in BEAT_VARIANTS if v != "tensors" or tensors]
    if old is not None:
        runs.insert(0, ("old", old.resolve(), "plain"))
    values: dict[str, list[float]] = {f"{code} {variant}": [] for code, _, variant in runs}
    for trial in range(trials):
        turn = trial % len(runs)
        for code, checkout, variant in runs[turn:] + runs[:turn]:
            ns = beat_trial(checkout, variant, calls // 5 if variant == "tensors" else calls)
            values[f"{code} {variant}"].append(ns)
            print(f"beat trial {trial + 1}/{trials}: {code} {variant}: {ns:.0f} ns per call", flush=True)
    return {name: {**spread(v), "values": v, "share_of_a_100ms_step": statistics.median(v) / STEP_NS}
            for name, v in values.items()}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--beat-calls", type=int, default=1_000_000, help="beat() calls per trial (a fifth with tensors)")
    p.add_argument("--tensors", action="store_true", help="also beat() with PyTorch scalars (needs torch)")
    p.add_argument("--old", type=Path, help="another checkout whose plain beat() is measured beside (today's code)")
    p.add_argument("--beat-only", action="store_true", help="measure beat() alone; straggler.json is not written")
    args = p.parse_args()
    started = time.monotonic()
    costs = beat_costs(args.trials, args.beat_calls, args.tensors, args.old)
    for name, cost in costs.items():
        print(f"{name}: {cost['median']:.0f} ns per call [{cost['min']:.0f}-{cost['max']:.0f}], "
              f"{100 * cost['share_of_a_100ms_step']:.4f} % of a 100 ms step", flush=True)
    if args.beat_only:
        print(json.dumps({"trials": args.trials, "calls": args.beat_calls, "beat": costs}, indent=2))
        return 0
    beats = costs["new plain"]["values"]
    false_positive_rates = []
    for trial in range(args.trials):
        found = simulate(1000 + trial, args.nodes, args.steps, None)["found"]
        false_positive_rates.append(len(found) / (args.nodes * args.steps) * 1e6)
        print(f"noise only, trial {trial + 1}: {len(found)} nodes flagged in {args.nodes * args.steps} node-steps",
              flush=True)
    delays: dict[str, list[float]] = {}
    missed: dict[str, int] = {}
    wrong: dict[str, int] = {}
    for factor in FACTORS:
        key = f"{factor:g}x"
        delays[key], missed[key], wrong[key] = [], 0, 0
        for trial in range(args.trials):
            rng = random.Random(2000 + trial)
            node, onset = rng.randrange(args.nodes), rng.randint(500, args.steps // 2)
            steps = onset + 2000
            found = simulate(3000 + trial, args.nodes, steps, (node, onset, factor))["found"]
            right = [at for at, n in found if n == node and at >= onset]
            wrong[key] += sum(1 for _, n in found if n != node)
            if right:
                delays[key].append(right[0] - onset)
            else:
                missed[key] += 1
        print(f"{key}: delay {delays[key]} steps; missed {missed[key]}; other nodes flagged {wrong[key]}", flush=True)
    result = {"trials": args.trials, "nodes": args.nodes, "steps": args.steps, "ranks_per_node": RANKS_PER_NODE,
              "policy": {"margin": 1.2, "window_steps": 30, "warmup_steps": 10, "read_every_steps": READ_EVERY},
              "beat_ns_per_call": spread(beats), "beat_by_variant": costs,
              "false_positives_per_million_node_steps": spread(false_positive_rates),
              "detection_delay_steps": {k: spread(v) for k, v in delays.items()},
              "missed": missed, "other_nodes_flagged": wrong, "seconds": round(time.monotonic() - started, 1)}
    out = Path(__file__).resolve().parent / "results" / "straggler.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
