#!/usr/bin/env python3
"""examples/torch_trainer.py under torchft 0.2.0: one replica group per node, data parallel across the groups
through torchft's Manager, going on with fewer replica groups when one fails instead of restarting the job.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000   # once, anywhere
    TORCHFT_LIGHTHOUSE=http://HOST:29510 REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node=2 --max-restarts=3 --master-port=PORT examples/peers/torchft_trainer.py \\
        --checkpoint-dir DIR --step-log FILE [torch_trainer options]    # once per node (replica group)

Followed: torchft's README (https://github.com/meta-pytorch/torchft: the lighthouse command above, then one
torchrun per replica group with REPLICA_GROUP_ID, NUM_REPLICA_GROUPS and TORCHFT_LIGHTHOUSE for its
train_ddp.py, whose loop is Manager + DistributedDataParallel + OptimizerWrapper over ProcessGroupGloo) and its Slurm example (torchft/examples/slurm/README.md in the wheel: the lighthouse
on a node every replica reaches, `--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000`; each
replica group a torchx/Slurm job restarted on failure — here torchrun's `--max-restarts`).  Defaults
(torchft_lighthouse --help, Manager.__init__): lighthouse heartbeat_timeout_ms 5000, join_timeout_ms 60000,
quorum_tick_ms 100; Manager timeout 60 s (collectives, should_commit), quorum_timeout 60 s, connect_timeout
60 s, heartbeat_interval 100 ms (TORCHFT_TIMEOUT_SEC / TORCHFT_QUORUM_TIMEOUT_SEC override them).

Each step a rank first averages its gradients over its own replica group (torchrun's gloo group: its ranks
are alive together or restarted together by torchrun), then across the groups through Manager.allreduce, over
the groups in the step's quorum; that is the only collective that waits on another group, and the Manager
turns its failure into a skipped step (should_commit false for the whole group) instead of an exception.
Not torchft.DistributedDataParallel: in torchft 0.2.0 its comm hook fails an assertion (`assert fut._fut`,
torchft/ddp.py) when the gloo work it waits on raises — _ManagedWork.wait() records the error and returns
False before it has set the future up — so a rank of a *surviving* group whose cross-group peer died
crashed, its partner gave up, and torchrun restarted that group too (3 of 10 trials, docs/measured.md).
The gloo process group's own timeout (ProcessGroupGloo(timeout=), what Manager.allreduce's wait is bounded
by) is the Manager's (TORCHFT_TIMEOUT_SEC, else torchft's 60 s), as torchft's train_ddp.py sets both.
A recovering group is healed by torchft from a live group's state (model, optimizer, data cursor); every
--checkpoint-every steps each group also saves a DCP checkpoint of its own (torch_trainer.save, under
DIR/replica-<id>), from which a group (re)starting resumes first (the case every group was lost).  The global rank in the step log is
replica_rank × group size + group rank, the world the step's participants × group size.
Model, data, checkpoints and the step log are torch_trainer's; the result is not bit-identical to an
unfaulted run (a step with fewer replicas averages fewer samples), which torchft does not promise.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: E402

import torch_trainer as tt  # noqa: E402  (examples/, one level up)
from step_log import StepLog  # noqa: E402


def train(args) -> int:
    group_rank, group_size = tt.env_int("RANK"), tt.env_int("WORLD_SIZE")
    replica_id = os.environ.get("REPLICA_GROUP_ID", "0")
    torch.set_num_threads(1)
    init_group(group_rank, group_size, in_group_timeout(args.timeout))
    model = tt.make_model(args.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    progress = {"cursor": 0}

    def load_state(state: dict) -> None:  # a live group's state, when torchft heals this one
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        progress["cursor"] = int(state["cursor"])

    def state() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict(), "cursor": progress["cursor"]}

    collective_timeout = datetime.timedelta(seconds=float(os.environ.get("TORCHFT_TIMEOUT_SEC", "60")))
    manager = Manager(pg=ProcessGroupGloo(timeout=collective_timeout), load_state_dict=load_state,
                      state_dict=state, min_replica_size=1, replica_id=f"replica-{replica_id}")
    optimizer = Optimizer(manager, inner)
    torch.manual_seed(args.seed + group_rank)
    own = args.checkpoint_dir / f"replica-{replica_id}"
    # A group (re)starting resumes from its own newest checkpoint, and torchft's Manager from that step (its
    # docs: save and restore the Manager's state with periodic checkpoints); a live group newer than it
    # then heals it.  Only rank 0 chooses, so a checkpoint appearing meanwhile changes nothing.
    chosen = [str(tt.latest_checkpoint(own) or "") if group_rank == 0 else None]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0]:
        step, progress["cursor"] = tt.load(Path(chosen[0]), model, inner, group_rank)
        manager.load_state_dict({"step": step, "batches_committed": step})
    step_log = StepLog(args.step_log)
    tt.log(f"replica group {replica_id}, rank {group_rank} of {group_size}: "
           f"{'resumed from ' + chosen[0] if chosen[0] else 'fresh start'}; joining the quorum")
    while manager.current_step() < args.steps:
        optimizer.zero_grad()  # starts the step's quorum
        replica_rank = manager.participating_rank() or 0
        rank, world = replica_rank * group_size + group_rank, manager.num_participants() * group_size
        x, y = tt.batch(args.seed, progress["cursor"] + rank * args.batch, args.batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        average_gradients(model, manager, group_size)
        before = manager.current_step()
        optimizer.step()  # applied only if every participant committed the step (the manager's step + 1)
        if args.step_time:
            time.sleep(args.step_time)
        if manager.current_step() > before:
            step = manager.current_step()
            progress["cursor"] += world * args.batch
            step_log.step(step, rank, world)
            if step % args.log_every == 0:
                tt.log(f"step {step} loss {loss.item():.6f}; world size {world}")
            if step % args.checkpoint_every == 0:
                tt.save(own, model, inner, step, progress["cursor"], group_rank, None)
    tt.log(f"done: step {manager.current_step()}")
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    return 0


def in_group_timeout(seconds: float) -> datetime.timedelta:
    """How long a rank waits on its own group's partner: --timeout, or the Manager's collective timeout
    (TORCHFT_TIMEOUT_SEC) when that is shorter.  A hung rank leaves its group's ManagerServer (in group rank
    0) heartbeating, so the lighthouse holds every quorum for that group ("need at least half of 2 healthy
    workers") until the group fails itself — its live rank giving up on this collective; later than the
    survivors' quorum timeout (60 s) and they fail in the quorum too (TimeoutError) and are restarted."""
    manager_timeout = float(os.environ.get("TORCHFT_TIMEOUT_SEC", seconds))
    return datetime.timedelta(seconds=min(seconds, manager_timeout))


def init_group(rank: int, size: int, timeout: datetime.timedelta) -> None:
    """The replica group's own gloo group, its rendezvous keys under this torchrun attempt's name: torchrun's
    static rendezvous (--master-port, as torchft's torchx component launches each group) keeps one store for
    every restart, and a restarted rank could otherwise read a dead rank's address from the attempt before
    (gloo: "connectFullMesh failed ... Connection refused"), give up and cost the group another restart."""
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun hosts it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                          is_master=rank == 0 and not agent_store, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"replica-group/attempt-{attempt}", store), rank=rank,
                            world_size=size, timeout=timeout)


def average_gradients(model: torch.nn.Module, manager: Manager, group_size: int) -> None:
    """The gradients' mean over this replica group's ranks, then over the quorum's replica groups (one flat
    buffer each way).  A failure across groups does not raise: the Manager records it and the step is not
    committed by any rank of this group."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # this group's own ranks
    flat /= group_size
    manager.allreduce(flat).wait()  # across groups: the mean over the participants, or the error recorded
    offset = 0
    for p, g in zip(model.parameters(), grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = tt.parse_args(argv)
    try:
        return train(args)
    except ValueError as exc:
        tt.log(f"cannot resume: {exc}")
        return tt.EXIT_USAGE
    except (RuntimeError, TimeoutError, dist.DistBackendError) as exc:  # TimeoutError: torchft's quorum
        tt.log(f"giving up ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        return tt.EXIT_PEER_LOST


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
