"""Benchmark multi-level checkpoints against today's synchronous save (issue #25), on one machine.

    .venv/bin/python bench/checkpoint_bench.py                                   # 1 GB/s, ~4 min
    .venv/bin/python bench/checkpoint_bench.py --rate-gbps 1 --rate-gbps 0.1     # both rates, ~9 min

The state: `--gb` GB of float32 CPU tensors in 256 MB pieces (plus a step counter), the shape of a
node's part of a large model's state; every piece filled with a pattern that each load is checked
against (the tensors are zeroed before each timed load).  torch.distributed.checkpoint (DCP) with
`no_dist=True` writes and reads it on both paths, as examples/torch_trainer.py and
clusterctl.checkpoint do.

Shared storage is this machine's disk (`--shared-dir`, default a temporary folder under /var/tmp)
behind a throttle that emulates a parallel filesystem's per-node bandwidth: every byte DCP writes to
or reads from it passes a token bucket holding 0.05 s of bytes (`bench/throttled_storage.py`: DCP
opens its files through `fs.create_stream`, which is wrapped), and DCP fsyncs what it writes.
`--rate-gbps` (repeatable) sets the rate: 1 GB/s by default (Llama 3's 2-7 TB/s over ~3,000 nodes),
and 0.1 GB/s to keep a GPU node's proportions on this machine: here DCP into tmpfs, SHA-256 and
loopback each run at about 1 GB/s, as fast as a 1 GB/s share of shared storage, whereas a GPU
node's host memory, NVMe and network are 10-50x its share.  The node-local tier is tmpfs
(`--local-dir`, /dev/shm); the buddy's tier is another folder of it (one machine plays both nodes).

The new path (`--new-path api`, the default) is clusterctl.checkpoint.Checkpointer for two nodes on
this machine, copies moved by the real copy server over loopback (bench/api_tiers.py); its flush
uses the API's own throttle at the same rate (`shared_bytes_per_second`).  `--new-path standin` is
the smallest honest stand-in: DCP into a tmpfs folder renamed into place, then a thread copies it to
the buddy's folder (SHA-256 computed while copying) and through the bench's throttle to shared
storage; no checksum in the stall, one checksum pass on a resume.

Per trial (`--trials`, default 5, after `--warmup` 1 discarded: this VM's first touch of a page is
slow), today's path and the new one alternate which goes first:

- today: `dcp.save` into the throttled shared folder: the **stall** (training waits for all of it);
  then `dcp.load` of it back through the throttle: the **shared read** (every node after a failure).
- new: the save returns once the node's copy is committed in its local tier: the **stall**;
  training steps (a 512x512 matmul loop, one thread) while the background copies run; from the
  save's return, the **replicate** lag (the copy complete on the buddy) and the **flush** lag
  (complete on shared storage); the steps' rate against the same loop with nothing in the
  background just before gives the **background slowdown**.  Then the resume, in a new step: a
  surviving node resumes from its own copy and loads it (**survivor read**); the replacement node
  fetches its copy from the buddy, verifies it, and loads it (**replacement read**: the slowest
  node, so the time a resume from local + buddy takes).  With the API, the SHA-256 of the committed
  copy that the save computed before returning (`shards_of`) is timed again on the same files after
  the background work: the **stall's checksums**.
- this machine's own speed on the same bytes: a copy of the state into tensors allocated
  beforehand (what a save staged through pinned host memory stalls for), and SHA-256 over it.

Median and min-max over the trials; the machine's conditions (load, memory, the other processes and
the share of CPU they used during each rate's trials).  Writes bench/results/checkpoint.json, which
bench/checkpoint_goodput.py reads.  Peak memory about 5 x --gb (the state, tmpfs copies, page cache);
every copy is removed after each trial.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist=True: one process, by design

from throttled_storage import Throttle, copy_file, throttled_filesystem  # noqa: E402

PIECE_BYTES = 256 << 20
RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint.json"
STEP_SIZE = 512


# ---- the state ------------------------------------------------------------------------------------
def make_state(total_bytes: int) -> dict[str, Any]:
    """Float32 tensors of PIECE_BYTES (the last one smaller) filled with their own pattern, and a step."""
    pieces: dict[str, torch.Tensor] = {}
    left, index = total_bytes, 0
    while left > 0:
        size = min(PIECE_BYTES, left) // 4
        pieces[f"piece{index:03d}"] = torch.empty(max(size, 1), dtype=torch.float32)
        left -= PIECE_BYTES
        index += 1
    state: dict[str, Any] = {"model": pieces, "progress": {"step": torch.tensor(0)}}
    fill(state)
    return state


def fill(state: dict[str, Any]) -> None:
    for index, tensor in enumerate(state["model"].values()):
        tensor.fill_(float(index + 1))
        tensor[::4099] = -float(index + 1)


def zero(state: dict[str, Any]) -> None:
    for tensor in state["model"].values():
        tensor.zero_()
    state["progress"]["step"].zero_()


def check_loaded(state: dict[str, Any], step: int) -> None:
    """The state a load left: every piece's sum (exact: small whole numbers, summed in float64) and the step."""
    for index, tensor in enumerate(state["model"].values()):
        value = float(index + 1)
        negatives = -(-len(tensor) // 4099)
        expected = value * (len(tensor) - 2 * negatives)
        total = float(torch.sum(tensor, dtype=torch.float64))
        if total != expected or float(tensor[-1]) == 0.0:
            raise SystemExit(f"checkpoint_bench: piece {index} sums to {total} after the load, not {expected}: "
                             "the checkpoint did not round-trip")
    if int(state["progress"]["step"]) != step:
        raise SystemExit(f"checkpoint_bench: step {int(state['progress']['step'])} loaded, not {step}")


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


# ---- today's path: a synchronous DCP save to shared storage ----------------------------------------
def sync_save(state: dict[str, Any], directory: Path, throttle: Throttle) -> float:
    """DCP into the throttled shared folder (fsynced, as DCP does by default); the seconds training waits."""
    writer = dcp.FileSystemWriter(str(directory))
    writer.fs = throttled_filesystem(throttle)
    began = time.perf_counter()
    dcp.save(state, storage_writer=writer, no_dist=True)
    return time.perf_counter() - began


def sync_read(state: dict[str, Any], directory: Path, throttle: Throttle) -> float:
    reader = dcp.FileSystemReader(str(directory))
    reader.fs = throttled_filesystem(throttle)
    began = time.perf_counter()
    dcp.load(state, storage_reader=reader, no_dist=True)
    return time.perf_counter() - began


# ---- the new path ----------------------------------------------------------------------------------
class NewPath(Protocol):
    """A node's checkpoint tiers as the bench drives them (one machine plays the node and its buddy)."""

    name: str

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Returns once the node's copy of `step` is committed in its local tier."""

    def background_done(self) -> bool:
        """The copy is complete on the buddy and (flushed) on shared storage."""

    def lags(self) -> tuple[float, float]:
        """(replicate, flush): seconds from the save's return until each copy was complete."""

    def stall_checksums(self, step: int) -> float | None:
        """Seconds to checksum the node's committed copy as the save did before returning (None: it does not)."""

    def read_survivor(self, state: dict[str, Any], step: int) -> float:
        """A surviving node loads its own copy; seconds."""

    def read_replacement(self, state: dict[str, Any], step: int) -> float:
        """A replacement node fetches the copy from the buddy, verifies and loads it; seconds."""

    def clean(self) -> None:
        """Remove every copy (tmpfs is memory)."""


class StandInTiers:
    """The stand-in: DCP into `local/.tmp-step-N`, renamed to `local/step-N`; a thread copies it to
    `buddy/step-N` (SHA-256 while copying) and then, through the throttle and fsynced, to
    `shared/step-N`; each written as `.tmp-*` and renamed after its last file."""

    name = "standin"

    def __init__(self, local_root: Path, buddy_root: Path, shared_root: Path, rate: float) -> None:
        self.local_root, self.buddy_root, self.shared_root, self.rate = local_root, buddy_root, shared_root, rate
        self._thread: threading.Thread | None = None
        self._returned = 0.0
        self._replicated: float | None = None
        self._flushed: float | None = None
        self._sums: dict[str, str] = {}
        self._error: BaseException | None = None

    def save(self, step: int, state: dict[str, Any]) -> None:
        staging = self.local_root / f".tmp-step-{step:012d}"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(staging)), no_dist=True)
        final = self.local_root / f"step-{step:012d}"
        os.rename(staging, final)
        self._returned = time.perf_counter()
        self._replicated = self._flushed = None
        self._thread = threading.Thread(target=self._background, args=(final, step), daemon=True)
        self._thread.start()

    def _background(self, copy_dir: Path, step: int) -> None:
        try:
            names = sorted(p.name for p in copy_dir.iterdir())
            self._sums = {name: copy_file(copy_dir / name, self.buddy_root / ".tmp" / name)[1] for name in names}
            os.rename(self.buddy_root / ".tmp", self.buddy_root / f"step-{step:012d}")
            self._replicated = time.perf_counter()
            throttle = Throttle(self.rate)
            for name in names:
                copy_file(copy_dir / name, self.shared_root / ".tmp" / name, throttle, fsync=True)
            os.rename(self.shared_root / ".tmp", self.shared_root / f"step-{step:012d}")
            self._flushed = time.perf_counter()
        except BaseException as exc:  # said by lags()
            self._error = exc

    def background_done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def lags(self) -> tuple[float, float]:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None or self._replicated is None or self._flushed is None:
            raise SystemExit(f"checkpoint_bench: the stand-in's background copy failed: {self._error!r}")
        return self._replicated - self._returned, self._flushed - self._returned

    def stall_checksums(self, step: int) -> float | None:
        return None

    def read_survivor(self, state: dict[str, Any], step: int) -> float:
        began = time.perf_counter()
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(self.local_root / f"step-{step:012d}")),
                 no_dist=True)
        return time.perf_counter() - began

    def read_replacement(self, state: dict[str, Any], step: int) -> float:
        source = self.buddy_root / f"step-{step:012d}"
        staging = self.local_root / f".tmp-stage-{step:012d}"
        began = time.perf_counter()
        for name, sha in self._sums.items():
            if copy_file(source / name, staging / name)[1] != sha:
                raise SystemExit(f"checkpoint_bench: {source / name} does not match its checksum")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(staging)), no_dist=True)
        return time.perf_counter() - began

    def clean(self) -> None:
        for root in (self.local_root, self.buddy_root, self.shared_root):
            for child in root.iterdir():
                shutil.rmtree(child)


def api_path(local_base: Path, shared_dir: Path, rate: float) -> NewPath:
    """The real Checkpointer, when this checkout has it (see api_tiers.py); SystemExit otherwise."""
    try:
        from api_tiers import ApiTiers  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise SystemExit(f"checkpoint_bench: --new-path api needs clusterctl.checkpoint.Checkpointer ({exc}); "
                         "use --new-path standin") from None
    tiers: NewPath = ApiTiers(local_base, shared_dir, rate)
    return tiers


# ---- training while the background runs ------------------------------------------------------------
def step_rate(seconds: float | None, until: Callable[[], bool] | None = None) -> tuple[float, int]:
    """Matmul steps per second for `seconds`, or until `until()`; (rate, steps)."""
    a = torch.full((STEP_SIZE, STEP_SIZE), 0.5)
    b = torch.full((STEP_SIZE, STEP_SIZE), 0.25)
    steps = 0
    began = time.perf_counter()
    while True:
        torch.mm(a, b)
        steps += 1
        elapsed = time.perf_counter() - began
        if (seconds is not None and elapsed >= seconds) or (until is not None and until()):
            return steps / elapsed, steps


# ---- the machine ---------------------------------------------------------------------------------
def conditions() -> dict[str, Any]:
    """Load, memory and the busiest other processes (their CPU over their lifetime, from ps), now."""
    meminfo = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        meminfo[key] = value.strip()
    listed = subprocess.run(["ps", "-eo", "pid=,pcpu=,rss=,args=", "--sort=-pcpu"], capture_output=True, text=True,
                            timeout=10).stdout.splitlines()
    others = [" ".join(line.split()[1:])[:120] for line in listed if line.split()[0] != str(os.getpid())]
    return {"utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "mem_available": meminfo.get("MemAvailable"), "shmem": meminfo.get("Shmem"),
            "busiest_other_processes(pcpu rss_kb args)": others[:5]}


class CpuMeter:
    """The machine's CPU used by other processes while this one ran: (all busy time in /proc/stat −
    this process's own CPU time) / (wall time × CPUs)."""

    def __init__(self) -> None:
        self._busy, self._own, self._wall = self._machine_busy(), self._own_cpu(), time.monotonic()

    @staticmethod
    def _machine_busy() -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_cpu() -> float:
        times = os.times()
        return times.user + times.system

    def others_share(self) -> float:
        busy = self._machine_busy() - self._busy
        own = self._own_cpu() - self._own
        wall = time.monotonic() - self._wall
        return max(0.0, busy - own) / (wall * (os.cpu_count() or 1))


def filesystem_of(path: Path) -> str:
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], f"{fields[2]} ({fields[0]} on {fields[1]})"
    return kind


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": [round(v, 4) for v in values]}


def machine_speed(state: dict[str, Any]) -> tuple[float, float]:
    """(copy of the state into tensors allocated beforehand, SHA-256 over its bytes), seconds."""
    import hashlib
    targets = [torch.empty_like(t) for t in state["model"].values()]
    for target in targets:
        target.fill_(0)  # touch the pages first: a pinned staging buffer is allocated once
    began = time.perf_counter()
    for target, tensor in zip(targets, state["model"].values()):
        target.copy_(tensor)
    copied = time.perf_counter() - began
    digest = hashlib.sha256()
    began = time.perf_counter()
    for tensor in state["model"].values():
        digest.update(memoryview(tensor.numpy()).cast("B"))
    hashed = time.perf_counter() - began
    del targets
    return copied, hashed


# ---- the run -----------------------------------------------------------------------------------
FIGURES = ("sync_stall_s", "sync_read_s", "tiered_stall_s", "stall_checksums_s", "replicate_s", "flush_s",
           "survivor_read_s", "replacement_read_s", "background_slowdown", "snapshot_copy_s", "sha256_s",
           "throttle_slept_s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every rate in --rate-gbps, one after the other, on the same state; the warm-up before the first."""
    torch.set_num_threads(1)
    before = conditions()
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.shared_dir))
    shm = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.local_dir))
    runs = []
    try:
        log(f"making {args.gb} GB of state")
        state = make_state(int(args.gb * 1e9))
        for number, gbps in enumerate(args.rate_gbps):
            runs.append(run_rate(args, state, gbps * 1e9, work, shm, args.warmup if number == 0 else 0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    return {"bench": "checkpoint", "state_bytes": state_bytes(state), "trials": args.trials, "warmup": args.warmup,
            "throttle_burst_seconds": 0.05, "shared_dir": filesystem_of(Path(args.shared_dir)),
            "local_dir": filesystem_of(Path(args.local_dir)),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
            "conditions": {"before": before, "after": conditions()}, "runs": runs}


def run_rate(args: argparse.Namespace, state: dict[str, Any], rate: float, work: Path, shm: Path,
             warmup: int) -> dict[str, Any]:
    """`warmup` + `--trials` trials at one shared-storage rate; the figures and their ratios."""
    today_dir = work / "today"
    shared_new = work / "tiers"
    local_root, buddy_root = shm / "node-a", shm / "node-b"
    for folder in (shared_new, local_root, buddy_root):
        folder.mkdir(parents=True, exist_ok=True)
    tiers: NewPath = (api_path(shm, shared_new, rate) if args.new_path == "api"
                      else StandInTiers(local_root, buddy_root, shared_new, rate))
    figures: dict[str, list[float]] = {k: [] for k in FIGURES}
    meter = CpuMeter()
    for trial in range(warmup + args.trials):
        kept = trial >= warmup
        step = trial + 1
        state["progress"]["step"].fill_(step)
        row: dict[str, float] = {}
        for path in (("today", "new") if trial % 2 == 0 else ("new", "today")):
            if path == "today":
                throttle = Throttle(rate)
                row["sync_stall_s"] = sync_save(state, today_dir, throttle)
                zero(state)
                row["sync_read_s"] = sync_read(state, today_dir, throttle)
                row["throttle_slept_s"] = throttle.slept
                check_loaded(state, step)
                shutil.rmtree(today_dir)
            else:
                idle_rate, _ = step_rate(args.idle_seconds)
                began = time.perf_counter()
                tiers.save(step, state)
                row["tiered_stall_s"] = time.perf_counter() - began
                busy_rate, _ = step_rate(None, tiers.background_done)
                row["background_slowdown"] = max(0.0, 1 - busy_rate / idle_rate)
                row["replicate_s"], row["flush_s"] = tiers.lags()
                checksums = tiers.stall_checksums(step)
                if checksums is not None:
                    row["stall_checksums_s"] = checksums
                zero(state)
                row["survivor_read_s"] = tiers.read_survivor(state, step)
                check_loaded(state, step)
                zero(state)
                row["replacement_read_s"] = tiers.read_replacement(state, step)
                check_loaded(state, step)
                tiers.clean()
            fill(state)
            state["progress"]["step"].fill_(step)
        row["snapshot_copy_s"], row["sha256_s"] = machine_speed(state)
        log(f"{rate / 1e9:g} GB/s " + ("trial" if kept else "warm-up") + f" {step}: "
            + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        if kept:
            for key, value in row.items():
                figures[key].append(value)
    result = {k: summary(v) for k, v in figures.items() if v}
    stall_share = result["tiered_stall_s"]["median"] / result["sync_stall_s"]["median"]
    speedup = result["sync_read_s"]["median"] / result["replacement_read_s"]["median"]
    return {"shared_rate_bytes_per_second": rate, "new_path": tiers.name, "figures": result,
            "other_processes_cpu_share": round(meter.others_share(), 3),
            "ratios": {"stall_share_of_sync": stall_share, "resume_read_speedup": speedup,
                       "survivor_read_speedup": result["sync_read_s"]["median"] / result["survivor_read_s"]["median"]},
            "goals": {"stall_at_most_10_percent": stall_share <= 0.10, "resume_read_at_least_3x": speedup >= 3.0}}


def log(message: str) -> None:
    print(f"checkpoint_bench: {message}", file=sys.stderr, flush=True)


def table(result: dict[str, Any]) -> str:
    return "\n\n".join(run_table(result, one) for one in result["runs"])


def run_table(result: dict[str, Any], one: dict[str, Any]) -> str:
    f = one["figures"]

    def cell(key: str) -> str:
        s = f[key]
        return f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]"

    gb = result["state_bytes"] / 1e9
    rate = one["shared_rate_bytes_per_second"] / 1e9
    lines = [f"{gb:.2f} GB per node, shared storage throttled to {rate:g} GB/s, new path: {one['new_path']}, "
             f"{result['trials']} trials, median [min-max] s; other processes used "
             f"{one.get('other_processes_cpu_share', 0):.0%} of the machine's CPU meanwhile",
             "| | today (sync to shared) | new (local + buddy + flush) |", "|---|---|---|",
             f"| training stall per checkpoint | {cell('sync_stall_s')} | {cell('tiered_stall_s')} |",
             *([f"| of which: checksums of the committed copy (the same work, timed after) | | "
                f"{cell('stall_checksums_s')} |"] if "stall_checksums_s" in f else []),
             f"| resume read (slowest node) | {cell('sync_read_s')} | {cell('replacement_read_s')} |",
             f"| resume read (a surviving node) | {cell('sync_read_s')} | {cell('survivor_read_s')} |",
             f"| copy complete on the buddy, after the save returned | | {cell('replicate_s')} |",
             f"| copy complete on shared storage, after the save returned | | {cell('flush_s')} |",
             f"| training speed lost while the copies run (share) | | {cell('background_slowdown')} |",
             f"| this machine: copy of the state into buffers allocated before | {cell('snapshot_copy_s')} | |",
             f"| this machine: SHA-256 over the state | {cell('sha256_s')} | |",
             f"stall: {one['ratios']['stall_share_of_sync']:.1%} of the synchronous save's (goal <= 10%); "
             f"resume read {one['ratios']['resume_read_speedup']:.2f}x faster (goal >= 3x)"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Multi-level checkpoints against a synchronous save (see the docstring).")
    p.add_argument("--gb", type=float, default=1.0, help="GB of state per node (default 1)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="trials run first and discarded (default 1)")
    p.add_argument("--rate-gbps", type=float, action="append",
                   help="shared storage's bandwidth per node, GB/s; repeatable (default 1; see the docstring for 0.1)")
    p.add_argument("--shared-dir", default="/var/tmp", help="where the emulated shared storage lives (a disk)")
    p.add_argument("--local-dir", default="/dev/shm", help="where the node-local tiers live (tmpfs)")
    p.add_argument("--new-path", choices=("api", "standin"), default="api")
    p.add_argument("--idle-seconds", type=float, default=0.5,
                   help="training steps measured with nothing in the background, per trial")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.rate_gbps = args.rate_gbps or [1.0]
    if args.gb <= 0 or args.trials < 1 or args.warmup < 0 or min(args.rate_gbps) <= 0:
        p.error("--gb and --rate-gbps must be positive, --trials at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # tmpfs is memory: a bench stopped with SIGTERM still removes its copies (run's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
