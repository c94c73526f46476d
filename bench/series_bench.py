"""Benchmark reading a long training series for `clusterctl report`: the read, the thinning, the memory.

    .venv/bin/python bench/series_bench.py [--lines 250000] [--trials 5] [--out PATH]

No Slurm, no testbed.  A job of three weeks at a 10 s summary interval (`--lines` 250,000 points),
written as the agent writes it (`TrainingPoint.to_json`, one line each, every figure present: about
340 bytes a line) into a temp file on this machine's local disk: a loss that falls with noise, a
spike of 50 at one point and a run of NaN losses, tokens/s and MFU with a dip, a restart inside the
allocation halfway (launch `restart-1`).  The file is written once, then read by fresh processes
(the page cache warm, as when `report` runs twice in a row; a cold read from shared storage adds the
file's transfer, about 85 MB).  Each trial, alternating:

- `read + thin`: what `report --html` does per job: `TrainingSeriesReader` (every line parsed and
  checked) folded by `thin_series` into at most 1,000 points per curve; its wall time (perf_counter)
  and the process's peak RSS over it (VmHWM, reset through /proc/self/clear_refs before);
- `ends`: what the text `report` does per job: `read_series_ends` (the first line and the file's
  last 64 KiB).

Checked in each trial: every point read, each curve at most 1,000 points, the loss spike and the
NaN run kept.  Figures: median and min-max over `--trials`.  A table on stdout, every trial in
`--out` (default bench/results/series.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.records.training_series import SERIES_NAME, TrainingPoint  # noqa: E402

T0 = 1_795_305_600.0
INTERVAL = 10.0
SPIKE_AT = 0.37
NAN_AT = (0.62, 0.6201)


def nan_losses(lines: int) -> range:
    """The points whose loss is NaN."""
    return range(math.ceil(NAN_AT[0] * lines), math.ceil(NAN_AT[1] * lines))


def write_series(job_dir: Path, lines: int, seed: int = 7) -> int:
    """The series of a job of `lines` summaries, as the agent writes it; its size in bytes."""
    rng = random.Random(seed)
    with open(job_dir / SERIES_NAME, "w", encoding="utf-8") as out:
        for i in range(lines):
            share = i / lines
            restarted = share >= 0.5
            loss = 2.0 + 8.0 / math.sqrt(1 + i / 50) + rng.gauss(0, 0.02)
            if int(SPIKE_AT * lines) == i:
                loss = 50.0
            if i in nan_losses(lines):
                loss = math.nan
            dip = 0.6 if 0.8 <= share < 0.801 else 1.0
            tokens = 4.26e6 * dip * (1 + rng.gauss(0, 0.01))
            point = TrainingPoint(at=T0 + INTERVAL * i, job_id="7", launch="restart-1" if restarted else "0",
                                  step=i * 5 - (50 if restarted else 0), steps_per_s=tokens / 8.2e6,
                                  tokens_per_s=tokens, flops_per_s=6e9 * tokens, mfu=6e9 * tokens / (256 * 989e12),
                                  loss=loss, grad_norm=abs(rng.gauss(0.8, 0.1)), slowest_node=f"gpu{i % 9973:05d}",
                                  slowest_step_s=0.52 + rng.random() / 50, reference_step_s=0.5)
            out.write(json.dumps(point.to_json(), sort_keys=True) + "\n")
    return (job_dir / SERIES_NAME).stat().st_size


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(job_dir: Path, what: str, lines: int) -> dict:
    """One trial of `what` in this (fresh) process."""
    from clusterctl.launcher.pure.training_curves import CURVE_LIMIT, thin_series
    from clusterctl.records.training_series import TrainingSeriesReader, read_series_ends
    _peak_rss_reset()
    before = _peak_rss_mb()
    started = time.perf_counter()
    if what == "ends":
        ends = read_series_ends(job_dir)
        took = time.perf_counter() - started
        assert ends is not None and ends[0].step == 0 and ends[1].step == (lines - 1) * 5 - 50
        return {"seconds": took, "peak_rss_mb": _peak_rss_mb(), "rss_before_mb": before}
    reader = TrainingSeriesReader(job_dir)
    curves = thin_series(reader)
    took = time.perf_counter() - started
    assert curves.points == lines == reader.lines and not reader.last_line_problem
    for curve in (curves.loss, curves.tokens_per_s, curves.steps_per_s, curves.mfu):
        assert 0 < len(curve) <= CURVE_LIMIT, len(curve)
    assert max(v for _, v in curves.loss) == 50.0, "the loss spike was thinned away"
    assert curves.not_finite_losses == len(nan_losses(lines)), curves.not_finite_losses
    assert min(v for _, v in curves.tokens_per_s) < 0.7 * 4.26e6, "the throughput dip was thinned away"
    return {"seconds": took, "peak_rss_mb": _peak_rss_mb(), "rss_before_mb": before,
            "points": {"loss": len(curves.loss), "tokens_per_s": len(curves.tokens_per_s), "mfu": len(curves.mfu)}}


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=250_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "series.json")
    parser.add_argument("--child", nargs=3, metavar=("JOB_DIR", "WHAT", "LINES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1], int(args.child[2]))))
        return
    with tempfile.TemporaryDirectory(prefix="series-bench-") as directory:
        job_dir = Path(directory)
        print(f"writing {args.lines:,} points ...", file=sys.stderr)
        size = write_series(job_dir, args.lines)
        trials: dict[str, list[dict]] = {"read + thin": [], "ends": []}
        for trial in range(args.trials):
            for what in ("read + thin", "ends"):
                done = subprocess.run([sys.executable, __file__, "--child", str(job_dir),
                                       "ends" if what == "ends" else "read", str(args.lines)],
                                      capture_output=True, text=True, check=False, timeout=600)
                if done.returncode != 0:
                    sys.exit(f"series_bench: the {what} trial failed:\n{done.stderr[-3000:]}")
                trials[what].append(json.loads(done.stdout))
                print(f"trial {trial + 1}: {what} {trials[what][-1]['seconds']:.3f} s", file=sys.stderr)
    load = os.getloadavg()
    result = {"lines": args.lines, "bytes": size, "trials": trials, "load_average": load,
              "seconds": {what: _summary([t["seconds"] for t in ts]) for what, ts in trials.items()},
              "peak_rss_mb": {what: _summary([t["peak_rss_mb"] for t in ts]) for what, ts in trials.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.lines:,} points, {size / 1e6:.1f} MB; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
    print("| what | seconds, median [min-max] | peak RSS MB, median [min-max] |\n|---|---|---|")
    for what in trials:
        s, m = result["seconds"][what], result["peak_rss_mb"][what]
        print(f"| {what} | {s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}] | "
              f"{m['median']:.0f} [{m['min']:.0f}-{m['max']:.0f}] |")


if __name__ == "__main__":
    main()
