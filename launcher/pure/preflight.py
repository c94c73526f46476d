"""Per-rank truth inside a job: the environment a rank gets and the check that it runs where
the rank map says (pure functions; `clusterctl.launcher.job.steps` applies them).

The check exists because the usual ways of getting this wrong are silent: `srun -w`
re-sorts nodes, `SLURM_NODEID` does not follow a hostfile, c10d ranks nodes by FQDN.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from clusterctl.records.rank_map import JobRankMap


class PlacedRanks(Protocol):
    """What a rank's checks and environment need of the map: the whole map (JobRankMap) or,
    inside a job, the one slot a rank read of the index (clusterctl.records.rank_index.SlotView)."""

    @property
    def world_size(self) -> int: ...

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def node_count(self) -> int: ...

    @property
    def master_addr(self) -> str: ...

    @property
    def master_port(self) -> int: ...

    def location(self, rank: int) -> tuple[str, int]: ...


MASTER_PORTS = range(20000, 32768)
"""Where a rendezvous port is picked: below Linux's ephemeral range (32768-60999), so outgoing
connections never take it, and above the well-known services."""


def master_port(configured: int | None, *, randbelow: Callable[[int], int] = secrets.randbelow,
                free: Callable[[int], bool] = lambda port: True, tries: int = 20) -> int:
    """The spec's port, or a random one from MASTER_PORTS that `free` says is not taken.

    Never derived from the job id: on a shared node another user could compute it and bind it
    first, so the job's rendezvous would fail (or talk to them).  The pick is recorded in the
    rank map, which every rank reads.
    """
    if configured:
        return configured
    port = MASTER_PORTS[randbelow(len(MASTER_PORTS))]
    for _ in range(tries):
        if free(port):
            return port
        port = MASTER_PORTS[randbelow(len(MASTER_PORTS))]
    return port


def hostfile_lines(rank_map: JobRankMap, per_gpu: bool) -> list[str]:
    """SLURM_HOSTFILE lines: task t runs on line t's node (one per rank, or one per node)."""
    repeat = rank_map.gpus_per_node if per_gpu else 1
    return [node for node in rank_map.slots for _ in range(repeat)]


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT")
"""The variables `rank_environment` sets for each rank (the job spec refuses them in [launch] env)."""


def rank_environment(rank_map: PlacedRanks, rank: int) -> dict[str, str]:
    """What every launcher style gives a rank: torch.distributed's variables, from the map."""
    node, gpu = rank_map.location(rank)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(gpu),
        "WORLD_SIZE": str(rank_map.world_size),
        "LOCAL_WORLD_SIZE": str(rank_map.gpus_per_node),
        "NODE_RANK": str(rank // rank_map.gpus_per_node),
        "GROUP_RANK": str(rank // rank_map.gpus_per_node),
        "MASTER_ADDR": rank_map.master_addr,
        "MASTER_PORT": str(rank_map.master_port),
    }


def visible_gpus(environ: Mapping[str, str]) -> list[str] | None:
    """GPU indices Slurm let this task see (CUDA_VISIBLE_DEVICES), None when unrestricted."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or value == "":
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def placement_problems(rank_map: PlacedRanks, rank: int, node: str, local_id: int | None,
                       visible: Sequence[str] | None) -> list[str]:
    """Why this task is not where the map puts `rank` (empty when it is)."""
    if not 0 <= rank < rank_map.world_size:
        return [f"rank {rank} is outside the map's {rank_map.world_size} ranks"]
    want_node, want_gpu = rank_map.location(rank)
    problems = []
    if node != want_node:
        problems.append(f"rank {rank} runs on {node} but the rank map puts it on {want_node} "
                        f"(was srun given -w, or SLURM_HOSTFILE ignored?)")
    if local_id is not None and local_id != want_gpu:
        problems.append(f"rank {rank} is task {local_id} on its node but the map gives it GPU {want_gpu} "
                        f"(tasks of one node must appear in GPU order)")
    if visible is not None and want_gpu >= len(visible):
        problems.append(f"rank {rank} needs local GPU {want_gpu} but only {len(visible)} are visible "
                        f"(CUDA_VISIBLE_DEVICES={','.join(visible)})")
    return problems


def node_problems(rank_map: PlacedRanks, node_rank: int, node: str) -> list[str]:
    """Why this per-node task (torchrun style) is not on the map's node for `node_rank`."""
    if not 0 <= node_rank < rank_map.node_count:
        return [f"node rank {node_rank} is outside the map's {rank_map.node_count} nodes"]
    want_node, _ = rank_map.location(node_rank * rank_map.gpus_per_node)
    if want_node != node:
        return [f"node rank {node_rank} runs on {node} but the rank map puts it on {want_node}"]
    return []


def torchrun_argv(rank_map: PlacedRanks, node_rank: int, python: str, job_dir: str,
                  command: Sequence[str]) -> list[str]:
    """torchrun with static rendezvous and the map's node rank; workers re-check their GPU."""
    return ["torchrun", f"--nnodes={rank_map.node_count}", f"--nproc-per-node={rank_map.gpus_per_node}",
            f"--node-rank={node_rank}", "--rdzv-backend=static", f"--master-addr={rank_map.master_addr}",
            f"--master-port={rank_map.master_port}", "--no-python",
            python, "-m", "clusterctl.launcher.job", "rank", "--under-torchrun", "--job-dir", job_dir, "--", *command]
