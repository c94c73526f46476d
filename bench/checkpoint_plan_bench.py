"""Benchmark the job's agent planning multi-level checkpoints at 1,250 and 12,500 nodes (8 ranks each).

    .venv/bin/python bench/checkpoint_plan_bench.py [--sizes 1250,12500] [--trials 5] [--out PATH]
    # an older commit beside this one, trials alternating (no venv needed: the code is imported from there):
    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/checkpoint_plan_bench.py --code before=/tmp/before --code after=. --no-reports

What is REAL: the agent's `TierPlanner` (launcher/job/checkpoint_plan.py) with the real inventory and
complete.json writers (launcher/shared/checkpoint_inventory.py), the real planning (`buddy_map`,
`resume_facts`, `plan_resume`, `slot_sources`: launcher/pure/checkpoint_tiers.py), the real tier index
writer and reader (clusterctl/records/tier_index.py), and the real node report encode/decode
(clusterctl/records/node_report.py).  What is SIMULATED: the nodes' holdings, as their reports carry them.
"Shared storage" (the job directory, the checkpoint directory) is a temp dir on this machine's local disk:
on NFS/Lustre every file written costs a few metadata round trips more, so the files and bytes written are
given beside the times.

The job: N nodes gpu00001..gpuN, 32 per leaf switch (the tree of plan_scale_bench.py / rankmap_bench.py),
slot s = node s+1, buddies from the real `buddy_map`.  Checkpoints every 100 steps, the newest 1100,
`keep = 2`, flushed every 500 steps: every node holds its own 2 local copies (1000, 1100), 2 buddy copies of
the node it keeps copies for (1000, 1100) and the 2 newest flushed (500, 1000): 6 copies a node.

Each trial is a fresh process (`--child`), measuring in turn, each with its wall time (perf_counter), the
process's peak RSS over it (VmHWM, reset before it through /proc/self/clear_refs) and every file it wrote
(`atomic_write`, wrapped to count paths and bytes):

  (1) observe, first: a new agent's `TierPlanner.observe` of every node's holdings, then `record_due` (what
      the agent does once a summary interval; writes complete.json for the 2 flushed checkpoints, and the
      inventory; a checkout older than record_due wrote the inventory in observe);
      observe, steady: one summary interval later, ~1/10 of the nodes changed (they saved step 1200);
      measured twice: at an interval where the inventory is not due (INVENTORY_EVERY not elapsed) and
      at one where it is;
  (2) resume after a node loss (the agent's critical path fault -> stepping again): node N/2 is gone, a
      spare takes its slot; `resume_point(present)` (complete.json read, `plan_resume_from_copies`; a
      checkout older than record_pending wrote the pending inventory first) then `launch_env(launch_dir,
      slots, leaf_of)` (`buddy_map`, `slot_sources`, tiers.idx, the settings); then, once the step is
      launched (off the critical path), `record_pending`: the inventory the plan's holdings left pending;
  (3) what one node reads of tiers.idx: `read_tier_slot` for the spare's slot, bytes from /proc/self/io
      (`rchar`: every read(2)/pread(2)) and the index's size;
  (4) one node report (8 ranks) with 32 held copies and without: its size (`encode`), and the agent's
      `decode` per report: a report from each of the N nodes (first: the holdings are parsed field by
      field) then each node's next heartbeat (holdings unchanged: taken from the decoder's per-node cache).

Figures: median and min-max over --trials.  A table on stdout, everything (each trial) in --out JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stats import percentile  # noqa: E402

RANKS_PER_NODE = 8
NODES_PER_LEAF = 32
STEP_EVERY = 100
NEWEST = 1100
FLUSH_EVERY = 500
KEEP = 2
T0 = 1_795_305_600.0
SPEC = """\
[job]
name = "llm"
nodes = {nodes}
gpus_per_node = 8

[launch]
command = ["python3", "train.py"]

[checkpoint]
dir = "{ckpt}"
tiers = true
keep = 2
flush_every_steps = 500
"""


def node_name(index: int) -> str:
    return f"gpu{index + 1:05d}"


def leaf_of(nodes: list[str]) -> dict[str, str]:
    """The generated tree's leaves: 32 nodes a leaf, in name order."""
    return {node: f"l{i // NODES_PER_LEAF}" for i, node in enumerate(nodes)}


def kept_for(buddies: dict[str, str]) -> dict[str, str]:
    """{node: the node whose copy it keeps} from buddy_map's {node: its buddy}."""
    return {buddy: node for node, buddy in buddies.items()}


def node_copies(node: str, slot: int, keeps: str, keeps_slot: int, slots: int, newest: int) -> list[Any]:
    """What `node` holds with keep = 2: its own newest 2 local copies, 2 of the node it keeps copies for,
    and its 2 newest flushed (every FLUSH_EVERY steps)."""
    from clusterctl.records.checkpoint_holdings import HeldCopy
    steps = [newest - STEP_EVERY * i for i in range(KEEP)][::-1]
    flushed = [s for s in range(newest, 0, -STEP_EVERY) if s % FLUSH_EVERY == 0][:KEEP][::-1]
    copies = [HeldCopy(s, node, "local", slot, slots, T0 + s, 2.0) for s in steps]
    copies += [HeldCopy(s, keeps, "buddy", keeps_slot, slots, T0 + s + 1, 2.0) for s in steps]
    copies += [HeldCopy(s, node, "shared", slot, slots, T0 + s + 30, 2.0) for s in flushed]
    return copies


def peak_reset() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def io_counter(key: str) -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Writes:
    """Every file written through atomic_write in the inventory and tier index modules: (path, bytes)."""

    def __init__(self) -> None:
        self.files: list[tuple[str, int]] = []

    def install(self) -> None:
        from clusterctl.launcher.shared import checkpoint_inventory
        from clusterctl.records import tier_index
        real = checkpoint_inventory.atomic_write

        def counted(path: Path, text: str, *, mode: int = 0o644) -> Path:
            self.files.append((path.name, len(text.encode("utf-8"))))
            return real(path, text, mode=mode)

        name = "atomic_write"  # replaced in both modules that write the planner's files
        for module in (checkpoint_inventory, tier_index):
            setattr(module, name, counted)

    def take(self) -> dict[str, Any]:
        files, self.files = self.files, []
        by_name: dict[str, list[int]] = {}
        for name, size in files:
            by_name.setdefault(name, []).append(size)
        return {"files": len(files), "bytes": sum(s for _, s in files),
                "by_name": {k: {"files": len(v), "bytes": sum(v)} for k, v in sorted(by_name.items())}}


@contextmanager
def measured(out: dict[str, Any], name: str, writes: Writes) -> Iterator[None]:
    peak_reset()
    base = status_mb("VmRSS")
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    out[name] = {"seconds": seconds, "peak_rss_mb": status_mb("VmHWM"), "rss_before_mb": base,
                 "written": writes.take()}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def child(nodes_count: int, work: Path, with_reports: bool = True) -> dict[str, Any]:
    """One trial at `nodes_count` nodes (see the module's docstring)."""
    from clusterctl.launcher.job.checkpoint_plan import INVENTORY_EVERY, TierPlanner
    from clusterctl.launcher.pure.checkpoint_tiers import buddy_map
    from clusterctl.launcher.pure.node_signals import heartbeat_seconds
    from clusterctl.launcher.pure.spec import parse_spec
    from clusterctl.records.checkpoint_holdings import CheckpointHoldings
    from clusterctl.records.tier_index import read_tier_slot

    out: dict[str, Any] = {"nodes": nodes_count}
    writes = Writes()
    writes.install()
    run_dir, shared = work / "run", work / "run" / "ckpt"
    job_dir = run_dir / "jobs" / "4242"
    job_dir.mkdir(parents=True)
    spec = parse_spec(SPEC.format(nodes=nodes_count, ckpt=shared), "job.toml", base_dir=work)
    nodes = [node_name(i) for i in range(nodes_count)]
    leaves = leaf_of(nodes)
    keeps = kept_for(buddy_map(nodes, leaves))
    slot = {node: i for i, node in enumerate(nodes)}

    def observe(holdings: dict[str, CheckpointHoldings]) -> None:
        tiers.observe(holdings)
        if hasattr(tiers, "record_due"):  # else observe wrote the inventory when due
            tiers.record_due()

    def holdings_of(node: str, newest: int) -> CheckpointHoldings:
        return CheckpointHoldings(node, tuple(node_copies(node, slot[node], keeps[node], slot[keeps[node]],
                                                          nodes_count, newest)), T0 + newest + 40)

    reported = {node: holdings_of(node, NEWEST) for node in nodes}
    clock = Clock()
    said: list[str] = []
    tiers = TierPlanner(run_dir, job_dir, spec, {"CLUSTERCTL_NODE_TMP": "/local/tmp"}, said.append, clock)
    interval = max(2.0, heartbeat_seconds(nodes_count))
    out["summary_interval_s"] = interval

    # (1) observe: the first, then an interval with 1/10 of the nodes changed (the inventory not due, then due).
    with measured(out, "observe_first", writes):
        observe(dict(reported))
    new_step = NEWEST + STEP_EVERY
    for name, advance in (("observe_steady", min(interval, INVENTORY_EVERY - 1)),
                          ("observe_steady_inventory_due", INVENTORY_EVERY)):
        # Checkpoint 1200's copies reach the agent over a few heartbeats: 1/10 of the nodes an interval.
        changed = nodes[::10] if name == "observe_steady" else nodes[5::10]
        for node in changed:
            reported[node] = holdings_of(node, new_step)
        clock.t += advance
        view = dict(reported)  # SignalWatch.holdings() hands the agent a fresh dict of the same objects
        with measured(out, name, writes):
            observe(view)
    out["changed_nodes"] = len(nodes[::10])
    out["inventory_bytes"] = (job_dir / "checkpoint-inventory.json").stat().st_size
    # Every node has reported checkpoint 1200 by the time a node is lost (not timed).
    tiers.observe({node: holdings_of(node, new_step) for node in nodes})
    writes.take()

    # (2) a node lost: the spare takes its slot; plan and write the step's tier index.
    lost = nodes[nodes_count // 2]
    spare = "spare00001"
    present = [n for n in nodes if n != lost] + [spare]
    slots = [spare if n == lost else n for n in nodes]
    leaves_now = {**leaves, spare: "spares"}
    launch = job_dir / "restart-1"
    launch.mkdir()
    clock.t += 1.0
    said.clear()
    started = time.perf_counter()
    with measured(out, "resume_point", writes):
        checkpoint = tiers.resume_point(present)
    with measured(out, "launch_env", writes):
        env = tiers.launch_env(launch, slots, leaves_now, avoid_port=29500)
    out["resume_total_seconds"] = time.perf_counter() - started
    if hasattr(tiers, "record_pending"):  # else resume_point wrote it
        with measured(out, "after_launch", writes):
            tiers.record_pending()
    out["resume_step"] = checkpoint.step if checkpoint else None
    out["plan_said"] = said[-3:]
    out["settings_env_bytes"] = sum(len(k) + len(v) for k, v in env.items())
    index = launch / "tiers.idx"
    out["tier_index_bytes"] = index.stat().st_size

    # (3) what one node (the spare) reads of the index.
    spare_slot = slots.index(spare)
    before = io_counter("rchar")
    itself = io_counter("rchar") - before  # what reading /proc/self/io adds
    before = io_counter("rchar")
    step, count, line = read_tier_slot(index, spare_slot)
    out["node_reads_bytes"] = io_counter("rchar") - before - itself
    out["spare_line"] = {"step": step, "slots": count, "tier": line.tier, "of_node": line.of_node,
                         "held_on": line.held_on}

    if with_reports:
        out["report"] = reports(nodes)
    out["peak_rss_mb_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def reports(nodes: list[str]) -> dict[str, Any]:
    """(4) a node report of 8 ranks with 32 held copies and without: its size, and decode per report over
    every node's first report and its next one (the holdings cached per node)."""
    from clusterctl.records import node_report
    from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy
    from clusterctl.records.node_report import NodeHealth, NodeReport, RankBeat, decode, encode
    from clusterctl.records.rank_progress import RankProgress
    key = secrets.token_bytes(32)
    slots = len(nodes)

    def report(i: int, node: str, copies: int | None, seq: int) -> NodeReport:
        ranks = tuple(RankBeat(RankProgress(i * RANKS_PER_NODE + r, node, 4321, "step", T0 + 4321.25, 100_000 + r,
                                            0.4123, 4321, T0 + 4321.5)) for r in range(RANKS_PER_NODE))
        held = None if copies is None else CheckpointHoldings(node, tuple(
            HeldCopy(4000 - 100 * (c // 3), nodes[(i + c % 3) % slots], ("local", "buddy", "shared")[c % 3],
                     (i + c % 3) % slots, slots, T0 + 4000.125 + c, 2.25) for c in range(copies)), T0 + 4100.5)
        return NodeReport("4242", "0", node, seq, T0 + 4321.75, ranks, NodeHealth("ok", (), T0 + 4320.0), held)

    out: dict[str, Any] = {}
    for name, copies in (("without", None), ("copies_6", 6), ("copies_32", 32)):
        node_report._last_holdings.clear()
        first = [encode(report(i, n, copies, 1), key) for i, n in enumerate(nodes)]
        again = [encode(report(i, n, copies, 2), key) for i, n in enumerate(nodes)]
        started = time.perf_counter()
        for datagram in first:
            decode(datagram, key, "bench")
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        for datagram in again:
            decode(datagram, key, "bench")
        again_s = time.perf_counter() - started
        out[name] = {"bytes": len(first[len(first) // 2]), "decode_first_us": first_s / len(nodes) * 1e6,
                     "decode_next_us": again_s / len(nodes) * 1e6}
    node_report._last_holdings.clear()
    return out


# ---- the driver ------------------------------------------------------------------------------------------

def summary(values: list[float], digits: int = 4) -> dict[str, Any]:
    """Median (statistics.median) and min-max of `values`, with their count."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "p50": round(percentile(values, 0.5), digits), "n": len(values)}


def pick(trial: dict[str, Any], path: str) -> float | None:
    value: Any = trial
    for part in path.split("."):
        if part not in value:
            return None
        value = value[part]
    return float(value)


FIGURES = (
    "observe_first.seconds", "observe_first.peak_rss_mb", "observe_first.written.bytes",
    "observe_steady.seconds", "observe_steady.peak_rss_mb", "observe_steady.written.bytes",
    "observe_steady_inventory_due.seconds", "observe_steady_inventory_due.peak_rss_mb",
    "observe_steady_inventory_due.written.bytes",
    "resume_point.seconds", "resume_point.peak_rss_mb", "resume_point.written.bytes",
    "launch_env.seconds", "launch_env.peak_rss_mb", "launch_env.written.bytes",
    "resume_total_seconds", "after_launch.seconds", "after_launch.peak_rss_mb", "after_launch.written.bytes",
    "inventory_bytes", "tier_index_bytes", "node_reads_bytes",
    "report.without.bytes", "report.copies_6.bytes", "report.copies_32.bytes",
    "report.without.decode_first_us", "report.without.decode_next_us",
    "report.copies_6.decode_first_us", "report.copies_6.decode_next_us",
    "report.copies_32.decode_first_us", "report.copies_32.decode_next_us",
    "peak_rss_mb_process",
)


def figures(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure's summary over `trials` (a figure a trial did not measure is left out)."""
    out = {}
    for figure in FIGURES:
        values = [v for v in (pick(t, figure) for t in trials) if v is not None]
        if values:
            out[figure] = summary(values)
    return out


def machine() -> dict[str, Any]:
    """What else ran: load average and the busiest processes at the time."""
    try:
        top = subprocess.run(["ps", "-eo", "pcpu,rss,args", "--sort=-pcpu"], capture_output=True, text=True,
                             timeout=10).stdout.splitlines()[1:6]
    except (OSError, subprocess.SubprocessError):
        top = []
    return {"at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg": os.getloadavg(),
            "cpus": os.cpu_count(), "busiest": [line.strip()[:160] for line in top]}


def run_trial(nodes: int, code: Path, with_reports: bool) -> dict[str, Any]:
    """One trial in a fresh process whose clusterctl is the checkout `code`."""
    work = Path(tempfile.mkdtemp(prefix=f"ckpt-plan-{nodes}-"))
    try:
        argv = [sys.executable, __file__, "--child", str(nodes), "--work", str(work), "--child-code", str(code)]
        done = subprocess.run(argv + ([] if with_reports else ["--no-reports"]), capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"trial at {nodes} nodes failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(results: dict[str, Any]) -> str:
    columns = [(name, n) for name in results["codes"] for n in results["sizes"]]
    rows = ["| figure | " + " | ".join(f"{name}: {n} nodes" for name, n in columns) + " |",
            "|---|" + "---:|" * len(columns)]
    for figure in FIGURES:
        cells = []
        for name, n in columns:
            s = results["figures"][name][str(n)].get(figure)
            cells.append(f"{s['median']:g} [{s['min']:g}–{s['max']:g}]" if s else "–")
        rows.append(f"| {figure} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def code_arg(text: str) -> tuple[str, Path]:
    """`NAME=CHECKOUT` or `CHECKOUT` (named after its folder)."""
    name, _, path = text.rpartition("=")
    return (name or Path(path).name), Path(path).resolve()


def main(argv: list[str] | None = None,
         run: Callable[[int, Path, bool], dict[str, Any]] = run_trial) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1250,12500")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "checkpoint_plan.json")
    parser.add_argument("--code", type=code_arg, action="append",
                        help="NAME=CHECKOUT whose clusterctl is measured (repeatable; trials alternate); "
                             "default this checkout")
    parser.add_argument("--no-reports", action="store_true", help="leave out (4), the node reports")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-code", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child_code:  # imported from there (child() imports clusterctl only now)
            sys.path.insert(0, args.child_code)
        print(json.dumps(child(args.child, args.work, not args.no_reports)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    codes = dict(args.code or [code_arg(str(Path(__file__).resolve().parent.parent))])
    results: dict[str, Any] = {"sizes": sizes, "trials": args.trials, "codes": {k: str(v) for k, v in codes.items()},
                               "machine_before": machine(), "runs": {name: {} for name in codes}}
    for trial in range(args.trials):
        for n in sizes:  # sizes and checkouts alternate: a busy moment of the machine slows them alike
            for name, code in codes.items():
                print(f"checkpoint-plan-bench {time.strftime('%H:%M:%S')}: {name}, {n} nodes, trial {trial + 1}",
                      file=sys.stderr, flush=True)
                results["runs"][name].setdefault(str(n), []).append(run(n, code, not args.no_reports))
    results["machine_after"] = machine()
    results["figures"] = {name: {str(n): figures(results["runs"][name][str(n)]) for n in sizes} for name in codes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
