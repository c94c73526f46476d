#!/usr/bin/env python3
"""A deterministic multi-node toy trainer (standard library only).

It behaves like a real data-parallel training job where that matters to clusterctl:

* Ranks come from RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
  (falling back to SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID under a plain srun).
* All ranks rendezvous over TCP at MASTER_ADDR:MASTER_PORT and every step does an
  all-reduce through rank 0, so a dead peer stops the others: they give up after
  --peer-timeout seconds instead of hanging forever.
* Each step a rank asks NVML about its GPU (through libnvidia-ml.so.1 via ctypes,
  as CUDA would hit the driver) and fails like a CUDA program when the GPU is lost.
  Its pretend compute (--step-time) takes longer in proportion when NVML says the GPU's SM
  clock is throttled (maximum over current clock), and each rank reports its compute time
  per step (before the all-reduce) through clusterctl.progress.beat when clusterctl is there.
* It pretends to train a model of --model-params parameters on --tokens-per-step tokens per rank
  per step (each rank its own batch, as in data parallelism): each step it reports those tokens,
  their FLOPs (6 x params x tokens) and a pretend loss (a falling curve, a function of the step)
  through beat(), and rank 0 logs the loss and the job's tokens/s over each log interval, so
  what `clusterctl status` measures can be compared with what the program saw.
* Rank 0 writes a checkpoint every --checkpoint-every steps atomically: files in a
  temp dir, fsync, manifest.json written last, rename to step-NNNNNNNN, fsync the
  parent.  A checkpoint without a valid manifest is incomplete and never resumed.
* In a clusterctl job with multi-level checkpoints on (`[checkpoint] tiers = true`), every rank
  saves its own state through `clusterctl.checkpoint` instead (its node's memory, a copy on a buddy
  node, every k-th to shared storage) and resumes from what `Checkpointer.resume()` staged.
* State is integers modulo a prime, so the final state is bit-identical whether or
  not the run was interrupted and resumed; rank 0 writes it to final.json.
* Resharding: a checkpoint resumes on fewer data-parallel replicas (clusterctl shrinks a job that has
  lost a node and has no spare, and says so in CLUSTERCTL_DP_SIZE, the replicas now, and
  CLUSTERCTL_DP_SIZE_ORIGINAL, the spec's; both default to the world size).  A step's work is
  the original world's slots (one a rank: CLUSTERCTL_DP_SIZE_ORIGINAL × the ranks of a replica), slot k
  a pure function of (seed, data cursor, k); rank r of a smaller world computes slots r, r+W, r+2W ...
  (W its world size) one after the other ("gradient accumulation": up to m = ceil(original world / W)
  of them, m times --step-time and m times the tokens) and the sum is taken modulo a prime, which does
  not depend on the order of its terms: a shrunk run ends bit-identical to an unshrunk one.
* `--state-mb N` gives each node N MB more state (the bulk of a model's weights and optimizer
  state, for benchmarks): every rank carries N / LOCAL_WORLD_SIZE MB of fixed bytes, saves them with
  each checkpoint and reads them back (and compares them) on a resume.  The classic way, each rank
  writes its part to `<checkpoint dir>/bulk/step-NNNNNNNN/rank-R.bin` before rank 0 writes the
  manifest (a barrier between), throttled to `--shared-mb-per-s` per node (shared storage's
  bandwidth per node, split evenly among its ranks; 0: none), and only the two newest steps' bulk
  is kept.  With multi-level checkpoints, it is `rank-R.bin` in the rank's part of the node's copy.

Exit codes: 0 done, 1 a peer was lost, 2 bad usage, 3 this rank's GPU was lost.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import inspect
import json
import math
import os
import random
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

try:  # clusterctl's progress channel: each rank's step, for the hang watch of a job with spares
    from clusterctl.progress import beat as _beat
except ImportError:  # run by a Python without clusterctl (this file is standard library only): nothing to report to
    _beat = None


def beat(step: int, phase: str = "step", **reported: float | None) -> None:
    """clusterctl.progress.beat when clusterctl is there; what this clusterctl cannot take yet (the training
    metrics: tokens, flops, loss, grad_norm) is left out rather than failing the step with a TypeError."""
    if _beat is None:
        return
    _beat(step, phase, **{key: value for key, value in reported.items() if key in _BEAT_TAKES})


_BEAT_TAKES = set(inspect.signature(_beat).parameters) if _beat is not None else set()

try:  # clusterctl's multi-level checkpoints (node memory, a buddy node, shared storage), when the job has them on
    from clusterctl.checkpoint import Checkpointer
except ImportError:  # an older clusterctl, or none: checkpoints go to --checkpoint-dir as before
    Checkpointer = None  # type: ignore[assignment,misc]

MODULUS = (1 << 61) - 1  # a Mersenne prime: all arithmetic stays exact
PARAMS = 64
EXIT_PEER_LOST, EXIT_USAGE, EXIT_GPU_LOST = 1, 2, 3
MANIFEST = "manifest.json"
RESUME_ENV = "CLUSTERCTL_RESUME_FROM"
DP_SIZE_ENV, DP_SIZE_ORIGINAL_ENV = "CLUSTERCTL_DP_SIZE", "CLUSTERCTL_DP_SIZE_ORIGINAL"
BULK_DIR = "bulk"
BULK_CHUNK = 4 << 20
BULK_KEPT = 2


class PeerLost(Exception):
    """A peer stopped answering or closed its connection."""


class BadUsage(Exception):
    """The environment asks for a run this trainer cannot do (exit code 2); the message says why."""


class DataParallel(NamedTuple):  # not a dataclass: tests and benches load this file without registering it
    """The data-parallel replicas now (`size`) and the spec's (`original`) of a world of `world` ranks: each
    replica is world / size ranks (its tensor/pipeline-parallel part, which a shrink never changes).  This
    trainer gives every rank a slot of work (a share of the global batch): a step is the original world's
    slots, `original` × world / size of them, whatever the world is now."""

    size: int
    original: int
    world: int

    @property
    def original_world(self) -> int:
        return self.original * (self.world // self.size)

    @property
    def micro_steps(self) -> int:
        """The most slots one rank computes a step (1 until the job shrinks)."""
        return -(-self.original_world // self.world)

    def slots(self, rank: int) -> range:
        """The slots of the global batch rank `rank` computes, in order (each one a micro-step): every
        world-th slot from its own, so the original world's slots are each computed exactly once."""
        return range(rank, self.original_world, self.world)


def data_parallel(world: int, environ: Mapping[str, str] = os.environ) -> DataParallel:
    """CLUSTERCTL_DP_SIZE and CLUSTERCTL_DP_SIZE_ORIGINAL (each the world size when unset), checked:
    BadUsage saying what is wrong.  The DP size must divide the world (each replica the same number of
    ranks), and a shrink never grows it past the original."""
    sizes = []
    for name in (DP_SIZE_ENV, DP_SIZE_ORIGINAL_ENV):
        value = environ.get(name, str(world))
        try:
            size = int(value)
        except ValueError:
            raise BadUsage(f"{name}={value!r} is not a whole number") from None
        if size < 1:
            raise BadUsage(f"{name}={value!r}: a data-parallel size is at least 1")
        sizes.append(size)
    size, original = sizes
    if world % size:
        raise BadUsage(f"{DP_SIZE_ENV}={size} does not divide the world's {world} ranks: each data-parallel "
                       "replica is the same number of ranks")
    if original < size:
        raise BadUsage(f"{DP_SIZE_ORIGINAL_ENV}={original} is below {DP_SIZE_ENV}={size}: a job grows back "
                       "to its spec's size at most")
    return DataParallel(size, original, world)


NVML_CLOCK_SM = 1  # nvmlClockType_t


class GpuLost(Exception):
    """NVML says this rank's GPU is gone (NVML_ERROR_GPU_IS_LOST)."""


# ---- the model: pure, deterministic -------------------------------------------------
def initial_state(seed: int) -> dict:
    rng = random.Random(seed)
    params = [rng.randrange(MODULUS) for _ in range(PARAMS)]
    return {"step": 0, "params": params, "rng": _rng_to_json(rng.getstate()), "data_cursor": 0}


def gradient(params: list[int], slot: int, cursor: int, seed: int) -> list[int]:
    """Slot `slot`'s contribution for the sample at `cursor` (a stand-in for a backward pass)."""
    digest = hashlib.sha256(f"{seed}:{cursor}:{slot}".encode()).digest()
    base = int.from_bytes(digest[:8], "little")
    return [(p * (slot + 3) + base + i) % MODULUS for i, p in enumerate(params)]


def accumulated(params: list[int], slots: range, cursor: int, seed: int) -> list[int]:
    """A rank's slots' contributions summed (modulo the prime: in any order, the same sum)."""
    total = [0] * len(params)
    for slot in slots:
        total = [(t + g) % MODULUS for t, g in zip(total, gradient(params, slot, cursor, seed), strict=True)]
    return total


def apply_update(params: list[int], summed: list[int], noise: int) -> list[int]:
    return [(p * 31 + g + noise + i) % MODULUS for i, (p, g) in enumerate(zip(params, summed, strict=False))]


def state_digest(state: dict) -> str:
    blob = json.dumps({"step": state["step"], "params": state["params"], "rng": state["rng"],
                       "data_cursor": state["data_cursor"]}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _rng_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(data: list) -> tuple:
    return (data[0], tuple(data[1]), data[2])


# ---- checkpoints ----------------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def write_checkpoint(directory: Path, state: dict) -> Path:
    """Write `state` atomically; the manifest is the last file written before the rename."""
    began = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(state["step"])
    tmp = directory / f".tmp-{checkpoint_name(state['step'])}-{os.getpid()}"
    tmp.mkdir()
    payload = json.dumps({"params": state["params"]}).encode()
    _write_synced(tmp / "params.json", payload)
    manifest = {
        "format": "clusterctl-toy-trainer/1",
        "step": state["step"],
        "data_cursor": state["data_cursor"],
        "rng": state["rng"],
        "params_sha256": hashlib.sha256(payload).hexdigest(),
        "written_at": time.time(),
        "save_seconds": round(time.monotonic() - began, 6),  # the checkpoint cost, for Young/Daly advice
    }
    _write_synced(tmp / MANIFEST, json.dumps(manifest).encode())
    _fsync_dir(tmp)
    if final.exists():
        # Resumed from an older checkpoint and reached this step again: rename() cannot
        # replace a non-empty directory, so move the stale one aside first.
        stale = directory / f".stale-{final.name}-{os.getpid()}"
        os.replace(final, stale)
        os.replace(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(directory)
    return final


def load_checkpoint(path: Path) -> dict:
    """Load and validate a checkpoint; raise ValueError saying what is wrong with it."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no {MANIFEST} (checkpoint incomplete)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable {MANIFEST}: {exc}") from None
    try:
        payload = (path / "params.json").read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: params.json missing: {exc}") from None
    if hashlib.sha256(payload).hexdigest() != manifest.get("params_sha256"):
        raise ValueError(f"{path}: params.json does not match the manifest's checksum")
    return {"step": manifest["step"], "params": json.loads(payload)["params"], "rng": manifest["rng"],
            "data_cursor": manifest["data_cursor"]}


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint in `directory` that validates; incomplete ones are skipped, with a note."""
    if not directory.is_dir():
        return None
    for candidate in sorted(directory.glob("step-*"), reverse=True):
        try:
            load_checkpoint(candidate)
            return candidate
        except ValueError as exc:
            log(f"skipping checkpoint: {exc}")
    return None


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---- the bulk of the state (--state-mb): bytes that only cost I/O ------------------------------
def bulk_bytes(seed: int, rank: int, size: int) -> bytes:
    """This rank's bulk state: `size` fixed bytes (a random MiB repeated: cheap to make at every start)."""
    block = random.Random(seed * 1_000_003 + rank).randbytes(min(size, 1 << 20))
    return block * (size // len(block)) + block[:size % len(block)] if size else b""


class Pace:
    """Keeps reads or writes at `rate` bytes per second on average (0: as fast as they go)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.began, self.moved = rate, time.monotonic(), 0

    def moved_bytes(self, count: int) -> None:
        self.moved += count
        if self.rate > 0:
            ahead = self.moved / self.rate - (time.monotonic() - self.began)
            if ahead > 0:
                time.sleep(ahead)


def bulk_path(directory: Path, step: int, rank: int) -> Path:
    return directory / BULK_DIR / checkpoint_name(step) / f"rank-{rank}.bin"


def write_bulk(path: Path, data: bytes, rate: float, *, sync: bool) -> None:
    """`data` into `path` (a temporary renamed into place), paced to `rate` bytes/s, fsynced when `sync`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    pace = Pace(rate)
    view = memoryview(data)
    with open(tmp, "wb") as f:
        for at in range(0, len(data), BULK_CHUNK):
            f.write(view[at:at + BULK_CHUNK])
            pace.moved_bytes(min(BULK_CHUNK, len(data) - at))
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_bulk(path: Path, expected: bytes, rate: float) -> None:
    """Read `path` back, paced to `rate` bytes/s; ValueError unless it holds exactly `expected`."""
    pace = Pace(rate)
    data = bytearray()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(BULK_CHUNK):
                data += chunk
                pace.moved_bytes(len(chunk))
    except OSError as exc:
        raise ValueError(f"{path}: the checkpoint's bulk state cannot be read ({exc})") from None
    if data != expected:
        raise ValueError(f"{path}: the bulk state read back is not the one saved ({len(data)} bytes)")


def prune_bulk(directory: Path, newest: int) -> None:
    """Rank 0: drop the bulk state of steps before the BULK_KEPT newest (disk space on long runs)."""
    steps = sorted(p for p in (directory / BULK_DIR).glob("step-*") if p.name <= checkpoint_name(newest))
    for old in steps[:-BULK_KEPT]:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the GPU, as CUDA would see it ----------------------------------------------------
class Gpu:
    """This rank's GPU through NVML (ctypes on libnvidia-ml.so.1); absent driver: no checks."""

    NVML_ERROR_GPU_IS_LOST = 15

    def __init__(self, local_rank: int) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        indexes = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        self.index = indexes[local_rank] if local_rank < len(indexes) else local_rank
        self.handle = ctypes.c_void_p()
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            self.lib = None
            return
        if self.lib.nvmlInit_v2() != 0:
            self.lib = None
            return
        self._call(self.lib.nvmlDeviceGetHandleByIndex_v2, ctypes.c_uint(self.index), ctypes.byref(self.handle))

    @property
    def present(self) -> bool:
        return self.lib is not None

    def check(self) -> None:
        """Raise GpuLost if the GPU fell off the bus (what a CUDA call would then report)."""
        if self.lib is None:
            return
        buf = ctypes.create_string_buffer(96)
        self._call(self.lib.nvmlDeviceGetUUID, self.handle, buf, ctypes.c_uint(96))

    def clocks(self) -> tuple[int, int] | None:
        """(current, maximum) SM clock in MHz, or None when NVML cannot say."""
        if self.lib is None:
            return None
        now, top = ctypes.c_uint(0), ctypes.c_uint(0)
        try:
            if self._call(self.lib.nvmlDeviceGetClockInfo, self.handle, NVML_CLOCK_SM, ctypes.byref(now)) != 0 or \
                    self._call(self.lib.nvmlDeviceGetMaxClockInfo, self.handle, NVML_CLOCK_SM, ctypes.byref(top)) != 0:
                return None
        except AttributeError:  # a driver without these calls
            return None
        return (now.value, top.value) if now.value and top.value else None

    def clock_factor(self) -> float:
        """How much slower this GPU computes now: its maximum SM clock over its current one (1.0 when
        NVML cannot say).  A thermally throttled GPU runs the same kernels at its lower clock."""
        clocks = self.clocks()
        return max(1.0, clocks[1] / clocks[0]) if clocks else 1.0

    def _call(self, fn, *args) -> int:
        rc = fn(*args)
        if rc == self.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"GPU {self.index} is lost (NVML_ERROR_GPU_IS_LOST)")
        return rc


# ---- communication: a star all-reduce through rank 0 ------------------------------------
class Group:
    """Newline-delimited JSON over TCP: rank 0 holds a connection to every other rank."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.peers: dict[int, tuple[socket.socket, object]] = {}
        if world == 1:
            return
        if rank == 0:
            self._serve(port)
        else:
            self._connect(addr, port)

    def _serve(self, port: int) -> None:
        server = socket.create_server(("", port), reuse_port=False)
        server.settimeout(self.timeout)
        deadline = time.monotonic() + self.timeout
        while len(self.peers) < self.world - 1:
            if time.monotonic() > deadline:
                raise PeerLost(f"only {len(self.peers) + 1} of {self.world} ranks joined within {self.timeout:g} s")
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(self.timeout)
            reader = conn.makefile("r")
            try:
                hello = json.loads(reader.readline())
            except (OSError, ValueError) as exc:
                raise PeerLost(f"a rank connected but sent no valid hello ({exc})") from None
            if hello.get("world") != self.world or hello.get("rank") in self.peers:
                raise PeerLost(f"bad hello from {hello}")
            self.peers[hello["rank"]] = (conn, reader)
        server.close()
        for conn, _ in self.peers.values():
            conn.sendall(b'{"start": true}\n')

    def _connect(self, addr: str, port: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise PeerLost(f"could not reach rank 0 at {addr}:{port} within {self.timeout:g} s") from None
                time.sleep(0.1)
        conn.settimeout(self.timeout)
        conn.sendall(json.dumps({"rank": self.rank, "world": self.world,
                                 "host": socket.gethostname()}).encode() + b"\n")
        reader = conn.makefile("r")
        self.peers[0] = (conn, reader)
        self._receive(0)

    def _receive(self, peer: int) -> dict:
        conn, reader = self.peers[peer]
        try:
            line = reader.readline()
        except (TimeoutError, OSError) as exc:
            raise PeerLost(f"rank {peer} did not answer within {self.timeout:g} s ({exc})") from None
        if not line:
            raise PeerLost(f"rank {peer} closed the connection")
        return json.loads(line)

    def _send(self, peer: int, message: dict) -> None:
        try:
            self.peers[peer][0].sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise PeerLost(f"rank {peer} is unreachable ({exc})") from None

    def all_reduce(self, values: list[int]) -> list[int]:
        """Sum `values` over all ranks (mod MODULUS), in rank order so every run adds alike."""
        if self.world == 1:
            return values
        if self.rank != 0:
            self._send(0, {"v": values})
            return self._receive(0)["sum"]
        contributions = {0: values}
        for peer in sorted(self.peers):
            contributions[peer] = self._receive(peer)["v"]
        total = [0] * len(values)
        for rank in sorted(contributions):
            total = [(t + v) % MODULUS for t, v in zip(total, contributions[rank], strict=False)]
        for peer in sorted(self.peers):
            self._send(peer, {"sum": total})
        return total

    def close(self) -> None:
        for conn, _ in self.peers.values():
            conn.close()


# ---- the run ----------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[{socket.gethostname()} rank {os.environ.get('RANK', os.environ.get('SLURM_PROCID', '?'))}] {message}",
          flush=True)


def env_int(*names: str, default: int | None = None) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise SystemExit(f"toy_trainer: {name}={value!r} is not a whole number") from None
    if default is None:
        raise SystemExit(f"toy_trainer: set {names[0]} (or run under srun)")
    return default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Deterministic multi-node toy trainer (see module docstring).")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", default="auto",
                   help="'auto' (newest complete checkpoint, the default), 'none', or a checkpoint path; "
                        f"${RESUME_ENV} overrides")
    p.add_argument("--step-time", type=float, default=0.05, help="Seconds of pretend compute per step.")
    p.add_argument("--peer-timeout", type=float, default=30.0, help="Give up on a silent peer after this long.")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--tokens-per-step", type=int, default=2048,
                   help="Tokens each rank pretends to process per step (reported to clusterctl; logged as tokens/s).")
    p.add_argument("--model-params", type=float, default=1e9,
                   help="Parameters of the pretend model: each token costs 6 x this many FLOPs (reported for MFU).")
    p.add_argument("--state-mb", type=float, default=0.0,
                   help="MB of bulk state per node, saved and resumed with every checkpoint (see module docstring)")
    p.add_argument("--shared-mb-per-s", type=float, default=0.0,
                   help="shared storage's bandwidth per node for the bulk state, MB/s (0: no limit)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        p.error("--steps and --checkpoint-every must be at least 1")
    if args.state_mb < 0 or args.shared_mb_per_s < 0:
        p.error("--state-mb and --shared-mb-per-s must not be negative")
    return args


def pretend_loss(step: int) -> float:
    """The loss this toy would like to have at `step`: falling from 10 towards 2 (a function of the step alone,
    so every rank and every resumed run says the same)."""
    return 2.0 + 8.0 / math.sqrt(1.0 + step / 10.0)


def tiered_state(ckpt, args: argparse.Namespace, rank: int, bulk: bytes = b"") -> tuple[dict, str]:
    """The state to start from in a job with multi-level checkpoints: what `resume()` staged on this node
    (every rank's own file, `rank-<r>.json`, checked against its recorded SHA-256, and its bulk state),
    else a fresh start."""
    began = time.monotonic()
    resume = ckpt.resume()
    if resume is None:
        return initial_state(args.seed), "fresh start (multi-level checkpoints: none to resume)"
    state = load_tiered(resume.directory, rank, bulk)
    return state, f"resumed step {resume.step} from {resume.source}" + _bulk_note(bulk, began)


def save_tiered(ckpt, state: dict, rank: int, bulk: bytes = b"") -> None:
    """This rank's state into the node's fast tier (returns once it is there; copies follow in the background)."""
    payload = json.dumps({"params": state["params"]}).encode()
    record = {"format": "clusterctl-toy-trainer-rank/1", "step": state["step"], "data_cursor": state["data_cursor"],
              "rng": state["rng"], "params": json.loads(payload)["params"],
              "params_sha256": hashlib.sha256(payload).hexdigest()}
    with ckpt.save_files(state["step"]) as directory:
        (Path(directory) / f"rank-{rank}.json").write_text(json.dumps(record))
        if bulk:
            write_bulk(Path(directory) / f"rank-{rank}.bin", bulk, 0, sync=False)


def load_tiered(directory, rank: int, bulk: bytes = b"") -> dict:
    """This rank's state from a staged copy; ValueError saying what is wrong with it."""
    if bulk:
        read_bulk(Path(directory) / f"rank-{rank}.bin", bulk, 0)
    path = Path(directory) / f"rank-{rank}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    payload = json.dumps({"params": record.get("params")}).encode()
    if hashlib.sha256(payload).hexdigest() != record.get("params_sha256"):
        raise ValueError(f"{path}: params do not match the recorded checksum")
    return {"step": record["step"], "params": record["params"], "rng": record["rng"],
            "data_cursor": record["data_cursor"]}


def resume_state(args: argparse.Namespace, rank: int = 0, bulk: bytes = b"", rate: float = 0.0) -> tuple[dict, str]:
    began = time.monotonic()
    choice = os.environ.get(RESUME_ENV) or args.resume
    if choice == "none":
        return initial_state(args.seed), "fresh start"
    if choice == "auto":
        found = latest_checkpoint(args.checkpoint_dir)
        if found is None:
            return initial_state(args.seed), "fresh start (no complete checkpoint)"
        choice = str(found)
    state = load_checkpoint(Path(choice))
    if bulk:
        read_bulk(bulk_path(Path(choice).parent, state["step"], rank), bulk, rate)
    return state, f"resumed from {choice}" + _bulk_note(bulk, began)


def _bulk_note(bulk: bytes, began: float) -> str:
    return f" ({len(bulk) / 1e6:.0f} MB of this rank's bulk state with it, in {time.monotonic() - began:.2f} s)" \
        if bulk else ""


def train(args: argparse.Namespace) -> int:
    rank = env_int("RANK", "SLURM_PROCID")
    world = env_int("WORLD_SIZE", "SLURM_NTASKS")
    local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = env_int("MASTER_PORT", default=29500)
    local_ranks = max(1, env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=1))
    dp = data_parallel(world)
    gpu = Gpu(local_rank)
    if rank == 0 and not gpu.present:
        log("no NVML driver on this host: GPU checks are off")
    bulk = bulk_bytes(args.seed, rank, int(args.state_mb * 1e6 / local_ranks))
    rate = args.shared_mb_per_s * 1e6 / local_ranks  # shared storage's bandwidth per node, split among its ranks
    ckpt = Checkpointer.from_env() if Checkpointer is not None else None
    state, how = tiered_state(ckpt, args, rank, bulk) if ckpt is not None else resume_state(args, rank, bulk, rate)
    if rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        shrunk = f" ({dp.micro_steps} micro-steps a step: {dp.original} replicas' work on {dp.size})" \
            if dp.micro_steps > 1 else ""
        log(f"{how}; world size {world}{shrunk}; steps {state['step']}..{args.steps}")
    group = Group(rank, world, addr, port, args.peer_timeout)
    rng = random.Random()
    rng.setstate(_rng_from_json(state["rng"]))
    tokens = args.tokens_per_step * dp.micro_steps  # this rank's share of the step
    flops_per_step = 6.0 * args.model_params * tokens
    logged = (time.monotonic(), state["step"])  # rank 0's tokens/s: over each log interval
    try:
        factor = 1.0
        while state["step"] < args.steps:
            started = time.monotonic()
            gpu.check()
            slower = gpu.clock_factor()
            if slower != factor:
                clocks = gpu.clocks()
                log(f"GPU {gpu.index} clocks back to full speed" if slower == 1.0 else
                    f"GPU {gpu.index} clocks at {1 / slower:.0%} (SM {clocks[0]}/{clocks[1]} MHz): steps compute "
                    f"{slower:.1f}x slower" if clocks else f"GPU {gpu.index} computes {slower:.1f}x slower")
                factor = slower
            time.sleep(args.step_time * factor * dp.micro_steps)
            contribution = accumulated(state["params"], dp.slots(rank), state["data_cursor"], args.seed)
            # This rank's own work ends here; from here on it waits for the slowest peer.
            compute = time.monotonic() - started
            summed = group.all_reduce(contribution)
            noise = rng.randrange(MODULUS)
            state = {"step": state["step"] + 1, "params": apply_update(state["params"], summed, noise),
                     "rng": _rng_to_json(rng.getstate()), "data_cursor": state["data_cursor"] + 1}
            loss = pretend_loss(state["step"])
            if state["step"] % args.log_every == 0 or state["step"] == args.steps:
                now = time.monotonic()
                tokens_per_s = world * tokens * (state["step"] - logged[1]) / max(now - logged[0], 1e-9)
                log(f"step {state['step']} took {now - started:.3f} s; loss {loss:.4f}; {tokens_per_s:.0f} tokens/s "
                    f"(the job's, since step {logged[1]})")
                logged = (now, state["step"])
            beat(state["step"], compute_seconds=compute, tokens=tokens, flops=flops_per_step, loss=loss)
            if ckpt is not None and state["step"] % args.checkpoint_every == 0:
                beat(state["step"], "checkpoint-save")
                save_tiered(ckpt, state, rank, bulk)
                if rank == 0:
                    log(f"checkpoint step {state['step']} saved to the node tier")
                beat(state["step"])
            elif state["step"] % args.checkpoint_every == 0 and (rank == 0 or bulk):
                beat(state["step"], "checkpoint-save")
                if bulk:  # every rank's part first; the manifest (rank 0's) only once all are written
                    write_bulk(bulk_path(args.checkpoint_dir, state["step"], rank), bulk, rate, sync=True)
                    group.all_reduce([0])
                if rank == 0:
                    log(f"checkpoint {write_checkpoint(args.checkpoint_dir, state)}")
                    if bulk:
                        prune_bulk(args.checkpoint_dir, state["step"])
                beat(state["step"])
    finally:
        group.close()
    if ckpt is not None:
        ckpt.close()
    if rank == 0:
        final = {"step": state["step"], "digest": state_digest(state), "world_size": world}
        tmp = args.checkpoint_dir / f".final.{os.getpid()}"
        tmp.write_text(json.dumps(final))
        os.replace(tmp, args.checkpoint_dir / "final.json")
        log(f"done: step {state['step']} digest {final['digest']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args)
    except PeerLost as exc:
        log(f"giving up: {exc}")
        return EXIT_PEER_LOST
    except GpuLost as exc:
        log(f"CUDA error: {exc}")
        return EXIT_GPU_LOST
    except ValueError as exc:
        log(f"cannot resume: {exc}")
        return EXIT_USAGE
    except BadUsage as exc:
        log(f"toy_trainer: {exc}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
