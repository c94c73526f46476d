"""What the prolog's reclaim of stale checkpoint tiers adds to a job start (healthd/node_tiers.py, stale_tiers.py).

    sudo .venv/bin/python bench/tier_reclaim_bench.py [--trials 5] [--gib 1]

Three figures, each median and min–max over `--trials`, on a fresh tier base in /dev/shm (tmpfs; root
1777, as /dev/shm itself) made for the run and removed after it, no Slurm:

- the listing and the decision on a node with nothing stale (20 users, 3 fresh run tiers each): what
  every job start pays;
- this machine's process table read for its uids (psutil): also paid at every job start;
- the removal of one stale run tier of `--gib` GiB (16 shards), through the door's fd-based checks,
  rename and `shutil.rmtree`: what reclaiming costs per byte.

Root is needed to give the trees to other users (chown).  Writes bench/results/tier_reclaim.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.healthd.node_tiers import LocalTiers, process_uids  # noqa: E402
from clusterctl.healthd.stale_tiers import ReclaimSettings, stale_tiers  # noqa: E402

DAY = 24 * 3600.0


def make_tier(user_dir: Path, key: str, uid: int, *, shards: int, shard_bytes: int, age_hours: float) -> None:
    """One run's tier of node3 (a local copy), owned by `uid`, its directories last changed `age_hours` ago."""
    tree = user_dir / f"ckpt-{key}"
    copy = tree / "node3" / "local" / "step-000000000040"
    copy.mkdir(parents=True, mode=0o700)
    block = b"\0" * (1 << 20)
    for shard in range(shards):
        with open(copy / f"shard-{shard}", "wb") as out:
            for _ in range(max(shard_bytes >> 20, 1)):
                out.write(block)
    for item in [user_dir, *user_dir.rglob("*")]:
        os.lchown(item, uid, uid)
    when = time.time() - age_hours * 3600
    for folder in [tree, *(p for p in tree.rglob("*") if p.is_dir())]:
        os.utime(folder, (when, when))


def timed(action: Callable[[], object], trials: int) -> list[float]:
    took = []
    for _ in range(trials):
        started = time.perf_counter()
        action()
        took.append(time.perf_counter() - started)
    return took


def summary(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(seconds) * 1e3, "min_ms": min(seconds) * 1e3,
            "max_ms": max(seconds) * 1e3, "trials": len(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the trees are given to other users (chown), as on a node")
    base = Path(tempfile.mkdtemp(prefix="ctbench-tiers-", dir="/dev/shm"))
    os.chmod(base, 0o1777)
    results: dict[str, object] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "base": str(base)}
    try:
        for uid in range(1000, 1020):
            user_dir = base / f"clusterctl-{uid}"
            user_dir.mkdir(mode=0o700)
            for run in range(3):
                make_tier(user_dir, f"{run:016x}", uid, shards=2, shard_bytes=1 << 20, age_hours=0)
        door = LocalTiers((str(base),), running_uids=lambda: frozenset(range(1000, 1020)))

        def look_and_decide() -> None:
            plan = stale_tiers(door.look(1000), (), ReclaimSettings(1000, DAY, time.time()))
            assert not plan.reclaims, plan

        results["nothing_stale_60_tiers"] = summary(timed(look_and_decide, args.trials))
        results["process_uids"] = summary(timed(process_uids, args.trials))
        results["processes"] = len(os.listdir("/proc")) - sum(1 for n in os.listdir("/proc") if not n.isdigit())
        shutil.rmtree(base)
        base.mkdir()
        os.chmod(base, 0o1777)
        removals = []
        shard_bytes = int(args.gib * (1 << 30)) // 16
        for _ in range(args.trials):
            user_dir = base / "clusterctl-2000"
            user_dir.mkdir(mode=0o700)
            make_tier(user_dir, "a" * 16, 2000, shards=16, shard_bytes=shard_bytes, age_hours=30)
            gone = LocalTiers((str(base),), running_uids=frozenset)
            plan = stale_tiers(gone.look(1000), (), ReclaimSettings(1000, DAY, time.time()))
            started = time.perf_counter()
            removed = [gone.remove(reclaim, 600.0) for reclaim in plan.reclaims]
            removals.append(time.perf_counter() - started)
            assert removed and all(r.error is None for r in removed) and not user_dir.exists(), removed
        results[f"remove_{args.gib:g}_gib"] = {**summary(removals),
                                              "gb_per_s": args.gib * (1 << 30) / 1e9 / statistics.median(removals)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = Path(__file__).resolve().parent / "results" / "tier_reclaim.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
