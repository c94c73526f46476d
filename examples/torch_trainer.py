#!/usr/bin/env python3
"""A small, deterministic PyTorch trainer: DDP over gloo on CPU, checkpoints with torch.distributed.checkpoint.

What clusterctl relies on, in the real library a training job would use:

* Ranks come from torchrun (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT) or from
  clusterctl's srun style, which sets the same variables; a gloo process group joins them.
* Gradients are averaged in rank order (a DDP communication hook), so the result does not depend on
  how DDP buckets them, which changes when a process restarts.
* The data order is a pure function of (seed, step), whatever the world size: the global batch of a
  step is D slots of --batch samples (D = $CLUSTERCTL_DP_SIZE_ORIGINAL, the spec's data-parallel size;
  the world size when unset), slot k reading samples cursor + k*batch ... cursor + (k+1)*batch - 1
  with the cursor (part of the checkpoint) advancing by D*batch a step.  Dropout's mask for slot k is
  drawn from a generator seeded by (seed, step, k), not from a rank's stream.
* Resharding: a checkpoint saved at one DP size resumes on a smaller one (clusterctl shrinks a job that
  lost a node and has no spare, and sets $CLUSTERCTL_DP_SIZE to the replicas now), or on a larger
  one up to D when the job grows back (the same code; only shrinks are tested).  Rank r of d ranks
  computes slots r*m ... r*m+m-1 (m = D/d micro-steps, DDP's no_sync on all but the last), summing
  their gradients, and the reduction divides by D: the same global batch and the same mean gradient.
  What is bit-identical and what is not (measured, docs/users-guide.md "Resharding in the examples"):
  the state loaded -- weights, AdamW's moments and step, the step and data cursor -- is bit-for-bit
  the state saved, and the samples each step reads and the dropout masks are the same.  The steps
  after are bit-identical too when the order of the gradient sum is unchanged: shrinking to one
  replica (its local sum, slot by slot, is the rank-ordered sum over all D); measured 2 -> 1,
  3 -> 1 and 4 -> 1: every later loss and checkpoint digest equal.
  Shrinking to d > 1 replicas with m > 1 (4 -> 2) sums (g0+g1)+(g2+g3) where D ranks summed
  ((g0+g1)+g2)+g3: float addition is not associative, so the weights differ in the last bits and
  later losses by up to ~2e-7 relative (measured over 95 steps, not growing: docs/measured.md).
* Every --checkpoint-every steps all ranks save with `torch.distributed.checkpoint.save` into
  `<checkpoint dir>/step-NNNNNNNN/`: model weights, optimizer state, every rank's RNG state (kept in
  the layout for examples/peers/; this trainer seeds dropout per slot and does not read it back), the
  data cursor and the step.  DCP writes `.metadata` last (after every rank's shards), so a
  directory without it was cut off mid-save; such a directory is never resumed from.
* In a clusterctl job with multi-level checkpoints on (`[checkpoint] tiers = true`), every rank
  saves its state through `clusterctl.checkpoint` instead (`save_state`: DCP into its node's memory,
  copied to a buddy node, every k-th flushed to shared storage) and resumes with `resume()` and
  `load_state`; the state saved is the same.
* Resume from $CLUSTERCTL_RESUME_FROM (set by clusterctl's supervisor), else --resume: 'auto'
  (the newest complete checkpoint), 'none', or a path.  At the same world size the final state
  is bit-identical with or without interruptions; rank 0 writes its digest to final.json.
* --loss-log FILE: rank 0 appends a JSON line per step (the global batch's mean loss, each slot's loss
  and first sample, the DP sizes) and one per checkpoint saved or resumed (the state's digest).
* Each step a rank asks NVML about its GPU (examples/toy_trainer.py's Gpu) and fails like a CUDA
  program when the GPU is lost, so an emulated Xid 79 ends the job as a real one would.
* Each step a rank reports to clusterctl (clusterctl.progress.beat, through toy_trainer's wrapper: nothing
  without clusterctl) its tokens -- here a sample is a token, so its --batch samples --, their FLOPs
  (6 x the model's parameters x tokens: forward and backward of a dense model), the loss (the tensor:
  clusterctl reads it only when it writes a report) and the gradient norm; rank 0 logs the loss and the
  job's tokens/s over each log interval, to compare with what `clusterctl status` measures.

Needs PyTorch (`pip install torch`); the CPU build is enough.
Exit codes: 0 done, 1 a peer was lost, 2 bad usage (bad DP sizes included) or an unusable checkpoint,
3 this rank's GPU was lost.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is optional to torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from step_log import StepLog  # noqa: E402  (next to this file)
from toy_trainer import BadUsage, DataParallel, Gpu, GpuLost, beat, data_parallel  # noqa: E402  (next to this file)

try:  # clusterctl's multi-level checkpoints (node memory, a buddy node, shared storage), when the job has them on
    from clusterctl.checkpoint import Checkpointer
except ImportError:  # an older clusterctl, or none: DCP checkpoints to --checkpoint-dir as before
    Checkpointer = None  # type: ignore[assignment,misc]

EXIT_PEER_LOST, EXIT_USAGE, EXIT_GPU_LOST = 1, 2, 3
RESUME_ENV = "CLUSTERCTL_RESUME_FROM"
METADATA = ".metadata"
FEATURES, HIDDEN = 16, 32


def log(message: str) -> None:
    print(f"[{socket.gethostname()} rank {os.environ.get('RANK', '?')}] {message}", flush=True)


# ---- model and data: pure functions of the seed -------------------------------------------
def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(HIDDEN, 1))


def batch(seed: int, first_sample: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples first_sample .. first_sample+size-1: each one a pure function of (seed, its index)."""
    xs, ys = [], []
    target = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, 1, generator=target)
    for index in range(first_sample, first_sample + size):
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        x = torch.randn(FEATURES, generator=g)
        xs.append(x)
        ys.append(torch.tanh(x @ weights) + 0.01 * torch.randn(1, generator=g))
    return torch.stack(xs), torch.stack(ys)


def slot_seed(seed: int, step: int, slot: int) -> int:
    """The seed of slot `slot`'s dropout at step `step` (the step about to be taken): the same on any world size."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{slot}".encode()).digest()[:8], "little")


def ordered_mean(replicas, bucket):  # no annotations: DDP checks them, and these are strings
    """DDP's gradient reduction, summed in rank order: an all-gather, then a local sum, divided by the
    original number of replicas (`replicas`; each rank's gradient is the sum of its micro-steps').

    gloo's ring all-reduce adds each element's 3+ contributions in an order that depends on the
    element's offset in DDP's bucket, and DDP lays its buckets out anew in a restarted process;
    float addition is not associative, so a resumed run would drift in the last bits."""
    tensor = bucket.buffer()
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    future = dist.all_gather(gathered, tensor, async_op=True).get_future()

    def mean(done):
        done.value()  # a failed all-gather (a peer died) raises here: never average what never arrived
        total = gathered[0].clone()
        for part in gathered[1:]:
            total += part
        return total / replicas

    return future.then(mean)


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, cursor: int) -> str:
    """sha256 over the step, data cursor, every weight and every optimizer tensor, in a fixed order."""
    h = hashlib.sha256(f"{step}:{cursor}".encode())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    for name in sorted(model_sd):
        h.update(name.encode())
        h.update(_tensor_bytes(model_sd[name]))
    for key in sorted(optim_sd["state"]):
        for name in sorted(optim_sd["state"][key]):
            value = optim_sd["state"][key][name]
            h.update(f"{key}.{name}".encode())
            h.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor.detach().clone(), buffer)  # exact bits, no numpy needed
    return buffer.getvalue()


# ---- checkpoints -------------------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def is_complete(path: Path) -> bool:
    """DCP renames .metadata into place after every rank's shards are written."""
    return (path / METADATA).is_file()


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint; ones cut off mid-save (no .metadata) are skipped, with a note."""
    if not directory.is_dir():
        return None
    for candidate in sorted(directory.glob("step-*"), reverse=True):
        if is_complete(candidate):
            return candidate
        log(f"skipping checkpoint {candidate}: no {METADATA} (cut off mid-save)")
    return None


def app_state(model, optimizer, step: int, cursor: int, rank: int, rng: bool = True) -> dict:
    """What a checkpoint holds; `rng=False` leaves out this rank's RNG state (to load onto another world
    size: a checkpoint has one for each rank that saved it, and this trainer seeds dropout per slot)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd,
             "progress": {"step": torch.tensor(step), "data_cursor": torch.tensor(cursor)}}
    if rng:  # one RNG state per rank under its own key: DCP keeps one copy of a key every rank saves
        state["rng"] = {f"rank{rank}": torch.get_rng_state()}
    return state


def save(directory: Path, model, optimizer, step: int, cursor: int, rank: int, die_in_save: int | None) -> Path:
    path = directory / checkpoint_name(step)
    if rank == 0 and path.exists():
        # A directory left by an earlier attempt: DCP would overwrite its shards one by one and
        # replace .metadata only at the end, so a cut-off save would look complete.  Start clean.
        shutil.rmtree(path)
    dist.barrier()
    began = time.monotonic()
    writer = dcp.FileSystemWriter(str(path))
    if die_in_save == step and rank == dist.get_world_size() - 1:
        writer = _DieAfterShards(str(path))
    dcp.save(app_state(model, optimizer, step, cursor, rank), storage_writer=writer)
    if rank == 0:
        log(f"checkpoint {path} in {time.monotonic() - began:.3f} s")
    return path


class _DieAfterShards(dcp.FileSystemWriter):
    """Fault injection (--die-during-save): this rank is SIGKILLed after writing its shards,
    before the coordinator can write .metadata: a checkpoint cut off mid-save, as PyTorch leaves it."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()
        log("killed during save (--die-during-save)")
        os.kill(os.getpid(), signal.SIGKILL)
        return future


def load(path: Path, model, optimizer, rank: int, rng: bool = True) -> tuple[int, int]:
    """Restore weights, optimizer and (with `rng`) this rank's RNG; returns (step, data cursor)."""
    if not is_complete(path):
        raise ValueError(f"{path}: no {METADATA}: the checkpoint was cut off mid-save")
    state = app_state(model, optimizer, 0, 0, rank, rng)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # DCP raises several kinds (CheckpointException, KeyError, RuntimeError)
        raise ValueError(f"{path}: cannot load ({type(exc).__name__}: {exc}); a checkpoint of another "
                         f"world size has no RNG state for rank {rank}") from None
    return restore(state, model, optimizer, rank)


def restore(state: dict, model, optimizer, rank: int) -> tuple[int, int]:
    """Put a loaded app_state into the model, the optimizer and this rank's RNG; (step, data cursor)."""
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if "rng" in state:
        torch.set_rng_state(state["rng"][f"rank{rank}"])
    return int(state["progress"]["step"]), int(state["progress"]["data_cursor"])


# ---- the run -------------------------------------------------------------------------------
class LossLog:
    """--loss-log: rank 0 appends a JSON line per step and per checkpoint (nothing on other ranks, or without
    the option; every rank still takes part in the step's all-gather when the option is given)."""

    def __init__(self, path: Path | None, dp: DataParallel, wanted: bool) -> None:
        self.path, self.dp, self.wanted = path, dp, wanted

    def step(self, step: int, losses: list[torch.Tensor], firsts: list[int]) -> None:
        """The step just taken: every slot's loss and first sample, gathered in slot order."""
        if not self.wanted:
            return
        mine = torch.tensor([[float(loss), float(first)] for loss, first in zip(losses, firsts, strict=True)],
                            dtype=torch.float64)
        gathered = [torch.empty_like(mine) for _ in range(self.dp.size)]
        dist.all_gather(gathered, mine)
        slots = torch.cat(gathered).tolist()
        self._write({"step": step, "loss": sum(loss for loss, _ in slots) / len(slots),
                     "slot_losses": [loss for loss, _ in slots], "slot_first_samples": [int(f) for _, f in slots],
                     "dp_size": self.dp.size, "dp_size_original": self.dp.original})

    def state(self, event: str, step: int, model, optimizer, cursor: int) -> None:
        """A checkpoint saved or resumed: the digest of the state in it."""
        if self.path is not None:
            self._write({"event": event, "step": step, "digest": state_digest(model, optimizer, step, cursor),
                         "dp_size": self.dp.size})

    def _write(self, record: dict) -> None:
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise SystemExit(f"torch_trainer: set {name} (run under torchrun, or clusterctl's srun style)")
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"torch_trainer: {name}={value!r} is not a whole number") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Deterministic PyTorch DDP trainer (see module docstring).")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", default="auto",
                   help=f"'auto' (newest complete checkpoint), 'none', or a checkpoint path; ${RESUME_ENV} overrides")
    p.add_argument("--batch", type=int, default=8, help="Samples per rank per step.")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0, help="Extra seconds per step (a slower job to fault).")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--timeout", type=float, default=60.0, help="Give up on a silent peer after this many seconds.")
    p.add_argument("--step-log", type=Path, help="Append a line per step per rank (examples/step_log.py): "
                   "the clock bench/peers_bench.py measures every tool by.")
    p.add_argument("--loss-log", type=Path, help="Rank 0 appends JSON lines: each step's losses and samples, "
                   "each checkpoint's state digest (see module docstring).")
    p.add_argument("--die-during-save", type=int, metavar="STEP",
                   help="Fault injection for tests: the last rank is killed while saving STEP's checkpoint "
                        "(in a run that started fresh; a resumed one goes on).")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1 or args.batch < 1:
        p.error("--steps, --checkpoint-every and --batch must be at least 1")
    return args


def pick_resume(args: argparse.Namespace) -> Path | None:
    choice = os.environ.get(RESUME_ENV) or args.resume
    if choice == "none":
        return None
    if choice == "auto":
        return latest_checkpoint(args.checkpoint_dir)
    return Path(choice)


def train(args: argparse.Namespace, on_step: Callable[[int], None] | None = None) -> int:
    """The run; `on_step(step)` after each step (examples/peers/: a peer's heartbeat)."""
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    dp = data_parallel(world)  # before joining the group: every rank refuses bad sizes alike, at once
    gpu = Gpu(env_int("LOCAL_RANK", 0))
    torch.set_num_threads(1)  # same arithmetic on every host, and light on a shared machine
    torch.use_deterministic_algorithms(True)
    timeout = datetime.timedelta(seconds=args.timeout)
    # The rendezvous store: torchrun's agent hosts it; under srun rank 0 does (and must leave last).
    hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), env_int("MASTER_PORT", 29500), world,
                          is_master=hosts_store, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    model = DistributedDataParallel(make_model(args.seed))
    model.register_comm_hook(dp.original, ordered_mean)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step, cursor = 0, 0
    ckpt = Checkpointer.from_env() if Checkpointer is not None else None
    if ckpt is not None:  # every node was told the same step to resume from (the job's tier index)
        resumed = ckpt.resume()
        chosen = [f"step {resumed.step} ({resumed.source})" if resumed else ""]
        if resumed is not None:
            state = app_state(model, optimizer, 0, 0, rank, rng=False)
            ckpt.load_state(state)
            step, cursor = restore(state, model, optimizer, rank)
            args.die_during_save = None
    else:
        # Rank 0 chooses, everyone loads the same one (a checkpoint appearing meanwhile changes nothing).
        chosen = [str(pick_resume(args) or "") if rank == 0 else None]
        dist.broadcast_object_list(chosen, src=0)
        if chosen[0]:
            step, cursor = load(Path(chosen[0]), model, optimizer, rank, rng=False)
            args.die_during_save = None  # the injected fault strikes once: a resumed run goes on
    if rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        shrunk = f" ({dp.micro_steps} micro-steps a step: {dp.original} replicas' batch on {dp.size})" \
            if dp.micro_steps > 1 else ""
        log(f"{'resumed from ' + chosen[0] if chosen[0] else 'fresh start'}; world size {world}{shrunk}; "
            f"steps {step}..{args.steps}; gpu checks {'on' if gpu.present else 'off (no NVML)'}")
    model.train()
    step_log = StepLog(args.step_log)
    loss_log = LossLog(args.loss_log if rank == 0 else None, dp, wanted=args.loss_log is not None)
    if chosen[0]:
        loss_log.state("resumed", step, model, optimizer, cursor)
    params = sum(p.numel() for p in model.parameters())
    logged = (time.monotonic(), step)  # rank 0's tokens/s: over each log interval
    while step < args.steps:
        started = time.monotonic()
        gpu.check()
        optimizer.zero_grad()
        losses, firsts = [], []
        slots = dp.slots(rank)
        for slot in slots:
            firsts.append(cursor + slot * args.batch)
            x, y = batch(args.seed, firsts[-1], args.batch)
            torch.manual_seed(slot_seed(args.seed, step, slot))
            # The gradients add up locally until the last micro-step, whose backward reduces them.
            with model.no_sync() if slot != slots[-1] else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()  # DDP all-reduces the gradients over gloo here
            losses.append(loss.detach())
        loss = torch.stack(losses).mean()
        grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in model.parameters()]))
        optimizer.step()
        step, cursor = step + 1, cursor + dp.original * args.batch
        loss_log.step(step, losses, firsts)
        if args.step_time:
            time.sleep(args.step_time)
        tokens = args.batch * dp.micro_steps
        beat(step, tokens=tokens, flops=6.0 * params * tokens, loss=loss, grad_norm=grad_norm)
        step_log.step(step, rank, world)
        if on_step is not None:
            on_step(step)
        if step % args.log_every == 0 or step == args.steps:
            now = time.monotonic()
            tokens_per_s = dp.original * args.batch * (step - logged[1]) / max(now - logged[0], 1e-9)
            log(f"step {step} loss {loss.item():.6f} took {now - started:.3f} s; {tokens_per_s:.0f} tokens/s "
                f"(the job's, since step {logged[1]})")
            logged = (now, step)
        if step % args.checkpoint_every == 0 and ckpt is not None:
            began = time.monotonic()
            ckpt.save_state(step, app_state(model, optimizer, step, cursor, rank))
            if rank == 0:
                log(f"checkpoint step {step} saved to the node tier in {time.monotonic() - began:.3f} s")
        elif step % args.checkpoint_every == 0:
            save(args.checkpoint_dir, model, optimizer, step, cursor, rank, args.die_during_save)
        if step % args.checkpoint_every == 0:
            loss_log.state("checkpoint", step, model, optimizer, cursor)
    digest = state_digest(model, optimizer, step, cursor)
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, digest)
    if rank == 0:
        if len(set(digests)) != 1:
            log(f"replicas disagree: {digests}")
            return EXIT_USAGE
        final = {"step": step, "digest": digest, "world_size": world}
        if dp.micro_steps > 1:  # the key only when shrunk: final.json of an unshrunk run reads as before
            final["dp_size_original"] = dp.original
        tmp = args.checkpoint_dir / f".final.{os.getpid()}"
        tmp.write_text(json.dumps(final))
        os.replace(tmp, args.checkpoint_dir / "final.json")
        log(f"done: step {step} digest {digest}")
    if ckpt is not None:
        ckpt.close()  # the node's background copies done, the newest flushed when the spec says so
    dist.barrier()
    dist.destroy_process_group()
    # The store's host leaves last: a rank whose store vanishes while it tears down its gloo group
    # aborts (std::terminate) instead of exiting 0.
    left = store.add("left", 1)
    deadline = time.monotonic() + args.timeout
    while hosts_store and left < world and time.monotonic() < deadline:
        time.sleep(0.05)
        left = store.add("left", 0)
    return 0


def main(argv: list[str] | None = None, on_step: Callable[[int], None] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args, on_step)
    except GpuLost as exc:
        log(f"CUDA error: {exc}")
        return EXIT_GPU_LOST
    except ValueError as exc:
        log(f"cannot resume: {exc}")
        return EXIT_USAGE
    except BadUsage as exc:
        log(f"torch_trainer: {exc}")
        return EXIT_USAGE
    except (RuntimeError, dist.DistBackendError, dcp.CheckpointException) as exc:  # a peer died or went silent
        log(f"giving up: a peer was lost ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        return EXIT_PEER_LOST


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the run needs is written and flushed by now.  PyTorch's C++ teardown at interpreter
    # exit sometimes aborts a rank that finished cleanly ("terminate called without an active
    # exception", seen once in about ten CI runs on a rank that was not the store's host), which srun
    # then reports as the job's failure: leave without it.
    os._exit(code)
