#!/usr/bin/env python3
"""examples/torch_trainer.py under NVIDIA's ft_launcher (nvidia-resiliency-ext 0.4.1): the same run, with a
heartbeat to NVRx's rank monitor after every step.

    ft_launcher --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        --max-restarts=3 --ft-rank-heartbeat-timeout=... examples/peers/nvrx_trainer.py \\
        --checkpoint-dir DIR --step-log FILE [torch_trainer options]

Followed: NVRx's fault tolerance usage guide and its heartbeats integration guide
(https://nvidia.github.io/nvidia-resiliency-ext/fault_tolerance/usage_guide.html and
.../fault_tolerance/integration/heartbeats.html): a single ft_launcher per node (on a Slurm cluster, one
per node from `srun`), the launchers meeting through torchrun's rendezvous (c10d on the first node), the
training script sending `RankMonitorClient.send_heartbeat()` every step, and a restarted rank resuming
from its last checkpoint (here: torch_trainer's `--resume auto`, the newest DCP checkpoint with its
`.metadata`).  Spares come from an elastic `--nnodes MIN:MAX` range.  Its default timeouts (nvidia_resiliency_ext/fault_tolerance/config.py,
FaultToleranceConfig): initial_rank_heartbeat_timeout 3600 s, rank_heartbeat_timeout 2700 s,
workload_check_interval 5 s, node_health_check_interval 5 s, restart_check_interval 60 s; the guide
says rank_heartbeat_timeout must be at least the longest interval between steps, and that no heartbeat is
sent while a checkpoint is saved or loaded: the most aggressive setting it allows is a few step times plus
a save, which bench/peers_bench.py uses for its "aggressive" row (5 s; a step here takes about 0.15 s).

Everything else (model, data, DDP over gloo, checkpoints, the step log) is torch_trainer's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch_trainer  # noqa: E402  (examples/, one level up)
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()  # connects to this rank's monitor, which ft_launcher started
    try:
        return torch_trainer.main(argv, on_step=lambda _step: monitor.send_heartbeat())
    finally:
        monitor.shutdown_workload_monitoring()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as torch_trainer: no C++ teardown at interpreter exit
