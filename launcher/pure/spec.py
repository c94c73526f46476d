"""The job spec: one TOML file an ML engineer writes, parsed into frozen dataclasses.

`FIELDS` is the single source of truth: the parser reads it, `clusterctl spec` prints it as
the reference.  Every error names the file, the line, the key, what was expected and what
was found; unknown keys are errors with a "did you mean".
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from clusterctl.slurm import hostlist
from clusterctl.launcher.pure.cost import DEFAULT_WEIGHTS
from clusterctl.errors import HostlistError, LayoutError, SpecError
from clusterctl.launcher.pure.parallel import (
    DATA_PARALLEL_VARIABLES, DIMS, ParallelLayout, layout_from_mapping, shrink_sizes, validate_for_cluster,
)
from clusterctl.launcher.pure.preflight import RANK_VARIABLES
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy
from clusterctl.records.checkpoint_settings import SETTINGS_ENV
from clusterctl.records.experiment_record import MAX_DATA_VERSION
from clusterctl.records.node_report import REPORT_ADDR_ENV, REPORT_INTERVAL_ENV, REPORT_KEY_ENV, REPORT_LAUNCH_ENV
from clusterctl.records.peer_beat import PEER_PORT_ENV


@dataclass(frozen=True)
class Field:
    """One key of the spec: where it lives, what it holds, its default and what it means."""

    section: str
    key: str
    kind: str  # str, int, float, bool, argv, strings, env, weights, time, hostlist, path, choice, switches
    doc: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


SLURM_TIME = re.compile(r"^(\d{1,6}-\d{1,2}(:\d{1,2}(:\d{1,2})?)?|\d{1,9}(:\d{1,2}(:\d{1,2})?)?|UNLIMITED|INFINITE)$",
                        re.ASCII)  # ASCII digits: `\d` alone also matches '١', which sbatch refuses
MAX_JOB_NAME_BYTES = 255
"""The longest job name (UTF-8 bytes) Slurm keeps whole everywhere (accounting's job_name column holds 255);
a far longer one would not even fit in sbatch's argv."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Options clusterctl sets itself from other keys; giving them in job.sbatch_options would fight them.
MANAGED_SBATCH = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--gpus-per-node", "--output", "-o",
                  "--error", "-e", "--job-name", "-J", "--chdir", "-D", "--parsable", "--switches", "--segment",
                  "--exclude", "-x", "--partition", "-p", "--account", "-A", "--time", "-t", "--requeue",
                  "--no-requeue", "--wrap")
DEFAULT_RESUME_ENV = "CLUSTERCTL_RESUME_FROM"
TORCHRUN_VARIABLES = ("ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE")
"""What torchrun sets for each worker besides RANK_VARIABLES (and TORCHELASTIC_*)."""
STEP_VARIABLES = ("CLUSTERCTL_JOB_DIR", "CLUSTERCTL_NODE_DIR", SETTINGS_ENV, REPORT_KEY_ENV, REPORT_ADDR_ENV,
                  REPORT_LAUNCH_ENV, REPORT_INTERVAL_ENV, PEER_PORT_ENV)
"""What clusterctl's agent sets for each step: where the job's records, the node directory, the report inbox and
the checkpoint tiers are."""
RUN_DIR_PLACEHOLDER = "{run_dir}"
COMMAND_PLACEHOLDERS = ("run_dir", "checkpoint_dir", "tp", "pp", "dp", "cp", "ep", "total_steps")
RESUME_PLACEHOLDERS = ("path",)
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# sbatch (getopt_long) accepts any unambiguous prefix of a long option (`--node=2` is --nodes);
# these exact sbatch options happen to be prefixes of managed ones and stay allowed.
UNMANAGED_PREFIXES = ("--gpus",)
EXIT_ACTIONS = ("restart", "exclude-node", "stop")
"""What a program's exit code may ask for (restart.exit_actions)."""
MAX_NODES = 100_000
MAX_RANKS = MAX_NODES * 128
DAY = 86_400.0

FIELDS: tuple[Field, ...] = (
    Field("job", "name", "str", "Job name (Slurm --job-name; at most 255 bytes, no control characters); also names the run directory.", required=True),
    Field("job", "nodes", "int", "Nodes the training runs on.", required=True, minimum=1, maximum=MAX_NODES),
    Field("job", "gpus_per_node", "int", "GPUs used on each node; one rank per GPU.", 8, minimum=1, maximum=128),
    Field("job", "spare_nodes", "int", "Extra nodes to allocate; the rank map picks the best `nodes` of "
          "them.", 0, minimum=0, maximum=MAX_NODES),
    Field("job", "partition", "str", "Slurm partition (--partition); default: the cluster's default."),
    Field("job", "account", "str", "Slurm account (--account)."),
    Field("job", "qos", "str", "Slurm QOS (--qos)."),
    Field("job", "constraint", "str", "Slurm node features the nodes must have (--constraint), e.g. 'h100'."),
    Field("job", "time", "time", "Time limit in Slurm's format: MM, HH:MM:SS, D-HH:MM..."),
    Field("job", "exclude", "hostlist", "Nodes never to use, as a hostlist (e.g. 'node[3,7]')."),
    Field("job", "runs_dir", "path", "Where run directories are made (must be visible from the compute "
          "nodes); default $CLUSTERCTL_RUNS or ~/.clusterctl/runs."),
    Field("job", "sbatch_options", "strings", "Extra sbatch options, one per item, e.g. ['--mem=0', "
          "'--exclusive'] (options clusterctl manages are refused).", ()),
    Field("job", "data_version", "str", "A label for the data the run trains on (a dataset name and version, a "
          "snapshot date, a hash): recorded with each attempt and shown by `clusterctl report`; at most "
          f"{MAX_DATA_VERSION} printable characters, never interpreted."),
    Field("job", "gpu_peak_tflops", "float", "Peak dense TFLOP/s of one GPU at the precision the program trains "
          "in, the MFU that `clusterctl status` shows is measured against (e.g. 989 for an H100 SXM in BF16); "
          "default: from the GPU model NVML names on the nodes (A100, H100, H200, B200, GB200), else no MFU.",
          minimum=0.001, maximum=1e6),
    Field("job", "total_steps", "int", "The step the training ends at (the step the program's last "
          "clusterctl.progress.beat reports): `clusterctl status` and its --watch show an ETA from it and the steps/s "
          "measured; default: no ETA.  '{total_steps}' in the command gives the program the same number.",
          minimum=1, maximum=10**15),
    Field("launch", "command", "argv", "What each rank runs, as an argv list (no shell): "
          "['python3', 'train.py', '--lr', '3e-4']; '{run_dir}', '{checkpoint_dir}', '{tp}', '{pp}', '{dp}', "
          "'{cp}', '{ep}' and '{total_steps}' are replaced.",
          required=True),
    Field("launch", "style", "choice", "srun: one task per GPU, RANK=SLURM_PROCID. torchrun: one task per "
          "node running torchrun with static rendezvous and --node-rank from the rank map.", "srun",
          choices=("srun", "torchrun")),
    Field("launch", "env", "env", "Environment for every rank: a table of NAME = 'value'.  Refused: what Slurm, "
          "torchrun or clusterctl sets for the job (SLURM_*, RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT..., "
          "the CLUSTERCTL_* of each step, checkpoint.resume_env) and LD_PRELOAD (it would reach clusterctl's own "
          "processes); srun's binding and wiring variables (SLURM_CPU_BIND, SLURM_MPI_TYPE, ...) are kept.", {}),
    Field("launch", "workdir", "path", "Directory the job runs in (relative to the spec file); it must exist when "
          "you submit.", "."),
    Field("launch", "template", "path", "Your own sbatch template instead of sbatch_templates/<style>.sbatch "
          "(same {{placeholders}})."),
    Field("launch", "python", "str", "Python with clusterctl installed, as an absolute path seen from the compute "
          "nodes; default: the one running `clusterctl submit`."),
    Field("launch", "tp_comm_overlap", "bool", "Megatron-LM tensor parallelism with sequence parallel / TP "
          "communication overlap (--sequence-parallel, --tp-comm-overlap): exports CUDA_DEVICE_MAX_CONNECTIONS=1 "
          "when tp > 1, which Megatron needs to queue its kernels in order on one connection. Leave it false for "
          "FSDP, torchtitan and the rest: one connection serialises their overlapping work.  Only the "
          "environment changes; a value of your own in [launch] env wins.", False),
    Field("launch", "master_port", "int", "Rendezvous port on rank 0's node; default: a random free port in "
          "20000-32767 picked by the job (recorded in its rank map), never one another user could guess.",
          minimum=1024, maximum=65535),
    Field("parallel", "tp", "int", "Tensor-parallel size (kept inside one node / NVLink domain).", 1, minimum=1, maximum=MAX_RANKS),
    Field("parallel", "pp", "int", "Pipeline-parallel size.", 1, minimum=1, maximum=MAX_RANKS),
    Field("parallel", "dp", "int", "Data-parallel size; default: whatever fills nodes × gpus_per_node.",
          minimum=1, maximum=MAX_RANKS),
    Field("parallel", "cp", "int", "Context-parallel size.", 1, minimum=1, maximum=MAX_RANKS),
    Field("parallel", "ep", "int", "Expert-parallel size.", 1, minimum=1, maximum=MAX_RANKS),
    Field("parallel", "order", "str", "Rank order: megatron (tp-cp-ep-dp-pp), megatron-tp-pp-dp, torchtitan, "
          "or an explicit order like tp-pp-dp.", "megatron"),
    Field("placement", "topology", "path", "topology.conf or saved `scontrol show topology`; default: ask "
          "Slurm inside the job."),
    Field("placement", "switches", "switches", "Ask Slurm for at most this many leaf switches "
          "(--switches); 'auto' = the fewest that can hold the job, 0 = don't ask.", "auto"),
    Field("placement", "switch_wait", "time", "How long Slurm may hold the job waiting for that many "
          "switches before placing it anyway.", "5:00"),
    Field("placement", "weights", "weights", "Relative traffic of each group kind, e.g. {dp = 2.0}; default "
          + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items()) + ".", {}),
    Field("checkpoint", "dir", "path", "Checkpoint directory the program writes (relative to the spec "
          "file, or '{run_dir}/...'); the supervisor resumes from its newest complete checkpoint."),
    Field("checkpoint", "validator", "choice", "How a complete checkpoint is recognised: manifest "
          "(clusterctl's manifest.json written last), dcp (PyTorch DCP .metadata), megatron "
          "(latest_checkpointed_iteration.txt), hf (Hugging Face Trainer's checkpoint-N/), lightning (*.ckpt), "
          "deepspeed (the `latest` file), auto (any of them).", "auto",
          choices=("auto", "manifest", "dcp", "megatron", "hf", "lightning", "deepspeed")),
    Field("checkpoint", "resume_args", "argv", "Arguments appended to the command when resuming; "
          "'{path}' becomes the checkpoint, e.g. ['--resume', '{path}'].", ()),
    Field("checkpoint", "resume_env", "str", "Environment variable that carries the checkpoint to resume "
          "from.", DEFAULT_RESUME_ENV),
    Field("checkpoint", "tiers", "bool", "Multi-level checkpoints (docs/checkpoint-tiers.md): the program saves "
          "through clusterctl.checkpoint to node-local storage, each node's part is copied to a buddy node and every "
          "flush_every_steps-th step to `dir`; a resume takes each node's part from the nearest verified copy "
          "(resume_args and resume_env are not used: the program asks clusterctl.checkpoint).", False),
    Field("checkpoint", "local_dir", "str", "With tiers: the node-local folder the fast tier lives under, the same "
          "path on every node; default: what the job's agent picks on its own node ($CLUSTERCTL_NODE_TMP, else "
          "/dev/shm (RAM), else $TMPDIR or /tmp): set this when the nodes differ there.", ""),
    Field("checkpoint", "local_budget_gb", "float", "With tiers: the most the fast tier (own and buddy copies) "
          "may hold on a node, in GB; 0: a quarter of that filesystem's size.  A save that would not fit goes "
          "straight to `dir` (the node is not failed).", 0.0, minimum=0, maximum=1e6),
    Field("checkpoint", "keep", "int", "With tiers: the newest checkpoints each node keeps (own and buddy copies).",
          2, minimum=1, maximum=100),
    Field("checkpoint", "flush_every_steps", "int", "With tiers: a checkpoint whose step is a multiple of this "
          "is also copied to `dir` in the background; 0: every checkpoint.", 0, minimum=0, maximum=10**12),
    Field("checkpoint", "flush_at_end", "bool", "With tiers: when the program ends, its newest checkpoint is "
          "copied to `dir` if it is not there yet.", True),
    Field("checkpoint", "shared_mb_per_s", "float", "With tiers: the most each node writes to `dir` per second "
          "while flushing, in MB/s (to be gentle with the parallel filesystem); 0: no limit.", 0.0, minimum=0,
          maximum=1e6),
    Field("restart", "max_restarts", "int", "Restarts allowed in the whole run before it stops: each recovery "
          "uses one, whether through the queue (a resubmission) or inside the allocation (a spare swapped in, "
          "the step started again in place).", 10, minimum=0, maximum=10_000),
    Field("restart", "max_program_failures", "int", "Failures with no node to blame (the program's own) "
          "retried before stopping.", 1, minimum=0, maximum=10_000),
    Field("restart", "retry_budget", "int", "Restarts (resubmissions or inside the allocation) allowed in a row "
          "without the checkpoint advancing; the budget refills whenever it advances.", 3, minimum=1, maximum=10_000),
    Field("restart", "backoff_seconds", "float", "Wait before the first resubmission; doubles each time "
          "without progress.", 2.0, minimum=0, maximum=DAY),
    Field("restart", "backoff_max_seconds", "float", "Longest wait between resubmissions.", 300.0, minimum=0,
          maximum=7 * DAY),
    Field("restart", "blame_hours", "float", "How long a blamed node stays excluded.", 24.0, minimum=0,
          maximum=24 * 365),
    Field("restart", "unresponsive_seconds", "float", "A node of a running attempt that Slurm flags not "
          "responding this long (and is not one of most of the job's nodes going quiet at once) ends the "
          "attempt; DOWN or drained by healthd ends it at once.", 30.0, minimum=0, maximum=DAY),
    Field("restart", "on_too_few_nodes", "choice", "When exclusions leave too few usable nodes: wait for "
          "nodes to come back, or stop.", "wait", choices=("wait", "stop")),
    Field("restart", "poll_seconds", "float", "How often the supervisor asks Slurm about its job while an "
          "attempt starts or ends (one single-job query).", 2.0, minimum=0.1, maximum=3600),
    Field("restart", "poll_max_seconds", "float", "The longest the supervisor waits between two looks at a job "
          "that is not changing (pending or running): the interval doubles from poll_seconds up to this. It "
          "bounds how late a running attempt's end or a drained node is seen.",
          8.0, minimum=0.1, maximum=3600),
    Field("restart", "hang_startup_seconds", "float", "Hung ranks (jobs with spares, programs that call "
          "clusterctl.progress.beat or log their steps): how long a rank may take to its first report and "
          "through its first steps.", 600.0, minimum=1, maximum=DAY),
    Field("restart", "hang_checkpoint_seconds", "float", "How long a rank may report `checkpoint-save` or "
          "`checkpoint-load` before it counts as hung.", 900.0, minimum=1, maximum=DAY),
    Field("restart", "hang_min_step_seconds", "float", "The shortest step timeout: a step's timeout is "
          "hang_safety_factor x the median step time learned from the reports, at least this.", 30.0,
          minimum=1, maximum=DAY),
    Field("restart", "hang_safety_factor", "float", "Step timeout = this x the learned median step time.",
          5.0, minimum=1, maximum=1000),
    Field("restart", "progress_pattern", "str", "For programs that only log: a regular expression with a group "
          "around the step number in a log line (the group named `step`, else the first), e.g. 'step (\\d+)'."),
    Field("restart", "exit_actions", "exit_actions", "What a rank's own exit code asks for: a table like "
          "{75 = 'restart', 76 = 'exclude-node', 77 = 'stop'}: restart from the last checkpoint (not counted as "
          "a program failure), restart without the node(s) whose ranks exited so (blamed), or stop the run. "
          "Read from srun's 'Exited with exit code N' lines.", {}),
    Field("restart", "recover", "choice", "With spare_nodes (either launch style): `in-allocation` keeps the "
          "allocation when a node fails (--no-kill), gives the node back to Slurm and starts a new step on a "
          "spare from the last complete checkpoint, without queueing again; `resubmit`: always through the "
          "queue.", "in-allocation", choices=("in-allocation", "resubmit")),
    Field("restart", "min_data_parallel", "int", "The smallest data-parallel size the job may shrink to inside "
          "its allocation when a node fails and no spare is left: whole DP replicas are dropped (TP and PP groups "
          "never split), the unused nodes given back, and the next step starts from the last complete "
          "checkpoint on the smaller world with CLUSTERCTL_DP_SIZE and CLUSTERCTL_DP_SIZE_ORIGINAL set (the "
          "program keeps its global batch by gradient accumulation, or rescales). Must be a size the layout can "
          "shrink to (whole nodes, ep dividing cp×dp); not with checkpoint.tiers (one part per node of the map "
          "that saved it). Default: parallel.dp (never shrink).", None, minimum=1,
          maximum=10**6),
    Field("restart", "webhook", "str", "URL that gets a JSON POST on blame, stop and completion."),
    Field("stragglers", "action", "choice", "Compare the ranks' compute time per step (clusterctl.progress.beat(step, "
          "compute_seconds=...)) across nodes: the in-allocation agent of a job with spares, the supervisor "
          "(`--supervise`) of any other. A node persistently "
          "slower than the job is: `report`ed (journal, status, report; the default), also `exclude`d from the "
          "next resubmission, or `swap`ped for a spare now (a new step from the last complete checkpoint; "
          "in-allocation recovery only, otherwise excluded). "
          "Evicted nodes are drained only when their GPUs' own evidence (healthd evidence: clock slowdown "
          "reasons, clocks, temperature) agrees.", "report", choices=("off", "report", "exclude", "swap")),
    Field("stragglers", "margin", "float", "Slow: compute time per step at least this many times the job's "
          "(the lower median over its nodes).", 1.2, minimum=1.01, maximum=100),
    Field("stragglers", "window_steps", "int", "...for this many steps in a row; shorter blips are ignored.", 30,
          minimum=1, maximum=10**9),
    Field("stragglers", "warmup_steps", "int", "Each rank's first steps are not judged.", 10, minimum=0,
          maximum=10**9),
)

SECTIONS = ("job", "launch", "parallel", "placement", "checkpoint", "restart", "stragglers")
_BY_SECTION: dict[str, dict[str, Field]] = {s: {f.key: f for f in FIELDS if f.section == s} for s in SECTIONS}


@dataclass(frozen=True)
class JobSection:
    name: str
    nodes: int
    gpus_per_node: int = 8
    spare_nodes: int = 0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str | None = None
    exclude: str | None = None
    runs_dir: str | None = None
    sbatch_options: tuple[str, ...] = ()
    data_version: str | None = None
    gpu_peak_tflops: float | None = None
    total_steps: int | None = None


@dataclass(frozen=True)
class LaunchSection:
    command: tuple[str, ...]
    style: str = "srun"
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = "."
    template: str | None = None
    python: str | None = None
    tp_comm_overlap: bool = False
    master_port: int | None = None


@dataclass(frozen=True)
class PlacementSection:
    topology: str | None = None
    switches: str | int = "auto"
    switch_wait: str = "5:00"
    weights: tuple[tuple[str, float], ...] = ()

    def weight_map(self) -> dict[str, float]:
        return {**DEFAULT_WEIGHTS, **dict(self.weights)}


@dataclass(frozen=True)
class CheckpointSection:
    dir: str | None = None
    validator: str = "auto"
    resume_args: tuple[str, ...] = ()
    resume_env: str = DEFAULT_RESUME_ENV
    tiers: bool = False
    local_dir: str = ""
    local_budget_gb: float = 0.0
    keep: int = 2
    flush_every_steps: int = 0
    flush_at_end: bool = True
    shared_mb_per_s: float = 0.0

    @property
    def recognised_by(self) -> str:
        """The validator that tells a complete checkpoint in `dir` (launcher/shared/checkpoints.py): with
        tiers, `tiers` (a step the job's agent marked flushed whole); else `validator`."""
        return "tiers" if self.tiers else self.validator


@dataclass(frozen=True)
class RestartSection:
    max_restarts: int = 10
    max_program_failures: int = 1
    retry_budget: int = 3
    backoff_seconds: float = 2.0
    backoff_max_seconds: float = 300.0
    blame_hours: float = 24.0
    unresponsive_seconds: float = 30.0
    on_too_few_nodes: str = "wait"
    poll_seconds: float = 2.0
    poll_max_seconds: float = 8.0
    recover: str = "in-allocation"
    hang_startup_seconds: float = 600.0
    hang_checkpoint_seconds: float = 900.0
    hang_min_step_seconds: float = 30.0
    hang_safety_factor: float = 5.0
    progress_pattern: str | None = None
    exit_actions: tuple[tuple[int, str], ...] = ()
    min_data_parallel: int | None = None
    """The smallest DP size a shrink may reach; None (a spec written before shrinking): never shrink."""
    webhook: str | None = None



@dataclass(frozen=True)
class JobSpec:
    """A validated job spec; paths are absolute (resolved against the spec file's folder)."""

    job: JobSection
    launch: LaunchSection
    parallel: ParallelLayout
    placement: PlacementSection = field(default_factory=PlacementSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    restart: RestartSection = field(default_factory=RestartSection)
    source: str = ""
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)

    @property
    def world_size(self) -> int:
        return self.job.nodes * self.job.gpus_per_node

    @property
    def runs_agent(self) -> bool:
        """The job script runs clusterctl's in-job agent (the built-in srun and torchrun templates): it hears
        the nodes' reports, and the supervisor reads its summary instead of the ranks' progress files."""
        return not self.launch.template

    @property
    def recovers_in_allocation(self) -> bool:
        """Node failures are recovered inside the allocation, on spares (a job with spares whose spec does not
        ask for recovery by resubmission; either launch style)."""
        return self.job.spare_nodes > 0 and self.restart.recover == "in-allocation"

    def checkpoint_dir(self, run_dir: str) -> str | None:
        """The checkpoint directory with `{run_dir}` filled in."""
        return self.checkpoint.dir.replace(RUN_DIR_PLACEHOLDER, run_dir) if self.checkpoint.dir else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; `spec_from_dict` reads it back (the run directory keeps it)."""
        data: dict[str, Any] = {name: asdict(getattr(self, name))
                                for name in ("job", "launch", "placement", "checkpoint", "restart", "stragglers")}
        layout = self.parallel
        data["parallel"] = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp, "ep": layout.ep,
                            "order": layout.order}
        data["launch"]["env"] = dict(self.launch.env)
        data["placement"]["weights"] = dict(self.placement.weights)
        data["restart"]["exit_actions"] = {str(code): action for code, action in self.restart.exit_actions}
        data["source"] = self.source
        return data


@dataclass(frozen=True)
class Overrides:
    """Values given on the command line; they win over the file.  `defaults` (the site's and the user's
    clusterctl.toml, launcher/pure/submit_defaults.py) only fill [job] keys the file leaves unset."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    name: str | None = None
    exclude: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    sbatch_options: tuple[str, ...] = ()
    """Added after the file's job.sbatch_options (sbatch takes the last of a repeated option)."""
    defaults: tuple[tuple[str, str], ...] = ()


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    """Inverse of JobSpec.to_dict (trusted input: our own run directory)."""
    launch = dict(data["launch"])
    launch["command"] = tuple(launch["command"])
    launch["env"] = tuple(launch["env"].items())
    job = dict(data["job"])
    job["sbatch_options"] = tuple(job["sbatch_options"])
    placement = dict(data["placement"])
    placement["weights"] = tuple(placement["weights"].items())
    checkpoint = dict(data["checkpoint"])
    checkpoint["resume_args"] = tuple(checkpoint["resume_args"])
    restart = dict(data["restart"])
    restart["exit_actions"] = tuple((int(code), action) for code, action in restart.get("exit_actions", {}).items())
    return JobSpec(JobSection(**job), LaunchSection(**launch), layout_from_mapping(data["parallel"]),
                   PlacementSection(**placement), CheckpointSection(**checkpoint), RestartSection(**restart),
                   data.get("source", ""), StragglerPolicy(**data.get("stragglers", {})))


# ---- parsing -------------------------------------------------------------------------
class _Where:
    """Finds the line of a key in the TOML text (tomllib reports no positions)."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line(self, section: str | None, key: str | None = None) -> int | None:
        current: str | None = None
        for number, raw in enumerate(self.lines, 1):
            line = raw.strip()
            header = re.match(r"^\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]", line)
            if header:
                current = header.group(1).strip("\"' ")
                if key is None and current == section:
                    return number
                continue
            if key is not None and current == section and re.match(rf"^[\"']?{re.escape(key)}[\"']?\s*=", line):
                return number
            if key is not None and current is None and re.match(rf"^{re.escape(section or '')}\.{re.escape(key)}\s*=",
                                                                line):
                return number
        return None

    def error(self, message: str, section: str | None = None, key: str | None = None) -> SpecError:
        number = self.line(section, key) if section else None
        location = f"{self.path}:{number}" if number else self.path
        dotted = f"{section}.{key}" if section and key else section
        return SpecError(message, path=location, key=dotted)


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(options)}"


def _describe(value: Any) -> str:
    kind = {str: "a string", int: "a whole number", float: "a number", bool: "true/false", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def slurm_time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for UNLIMITED.

    ValueError says what is wrong: the shape, or a field out of range (minutes and seconds after
    the first field up to 59, hours after a day up to 23: `1:99:99` is a typo, not 2 h 40 min)."""
    if not isinstance(text, str) or not SLURM_TIME.fullmatch(text):
        raise ValueError("a Slurm time like 90, 1:30:00 or 2-00:00:00")
    if text in ("UNLIMITED", "INFINITE"):
        return None
    days_text, dash, clock = text.rpartition("-")
    fields = [int(part) for part in clock.split(":")]
    if dash:  # D-HH[:MM[:SS]]: every field after the day is bounded
        units = ("hours", "minutes", "seconds")[:len(fields)]
        bounded = list(zip(units, fields))
    else:  # MM, MM:SS or HH:MM:SS: the first field is not bounded
        units = (("minutes",), ("minutes", "seconds"), ("hours", "minutes", "seconds"))[len(fields) - 1]
        bounded = list(zip(units, fields))[1:]
    for unit, number in bounded:
        limit = 23 if unit == "hours" else 59
        if number > limit:
            raise ValueError(f"a Slurm time with {unit} from 0 to {limit} (like 1:30:00 or 2-12:00:00)")
    amount = dict(zip(units, fields))
    days = int(days_text) if dash else 0
    return ((days * 24 + amount.get("hours", 0)) * 60 + amount.get("minutes", 0)) * 60 + amount.get("seconds", 0)


def _check_tiers(values: dict[str, dict[str, Any]], where: _Where) -> None:
    """Multi-level checkpoints need a shared directory to flush to, an agent in the job, an absolute local folder."""
    checkpoint = values["checkpoint"]
    if not checkpoint["tiers"]:
        return
    if checkpoint["dir"] is None:
        raise where.error("needs [checkpoint] dir: the shared directory every flush_every_steps-th checkpoint is "
                          "copied to (e.g. '{run_dir}/checkpoints')", "checkpoint", "tiers")
    if values["launch"]["template"]:
        raise where.error("needs the built-in templates (their agent plans each resume across tiers); a job with "
                          "its own [launch] template cannot use it", "checkpoint", "tiers")
    if checkpoint["local_dir"] and not checkpoint["local_dir"].startswith("/"):
        raise where.error(f"{checkpoint['local_dir']!r} is not an absolute path: a node-local folder like "
                          "'/local/scratch' (it is the same path on every node)", "checkpoint", "local_dir")


def _has_control(text: str) -> bool:
    """Control characters: C0 (newline, tab, escape...), DEL and C1."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def _bad(spec_field: Field, value: Any, where: _Where, expected: str) -> SpecError:
    """The error for a value of the wrong shape: what was expected, what was found, where."""
    return where.error(f"expected {expected}, found {_describe(value)}", spec_field.section, spec_field.key)


def _convert_int(spec_field: Field, value: Any, where: _Where) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(spec_field, value, where, "a whole number")
    if spec_field.minimum is not None and value < spec_field.minimum:
        raise _bad(spec_field, value, where, f"a whole number of at least {spec_field.minimum:g}")
    if spec_field.maximum is not None and value > spec_field.maximum:
        raise _bad(spec_field, value, where, f"a whole number of at most {spec_field.maximum:,.0f}")
    return value


def _convert_bool(spec_field: Field, value: Any, where: _Where) -> Any:
    if not isinstance(value, bool):
        raise _bad(spec_field, value, where, "true or false")
    return value


def _convert_float(spec_field: Field, value: Any, where: _Where) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(spec_field, value, where, "a number")
    if not math.isfinite(value):
        raise _bad(spec_field, value, where, "a finite number")
    if spec_field.minimum is not None and value < spec_field.minimum:
        raise _bad(spec_field, value, where, f"a number of at least {spec_field.minimum:g}")
    if spec_field.maximum is not None and value > spec_field.maximum:
        raise _bad(spec_field, value, where, f"a number of at most {spec_field.maximum:g}")
    return float(value)


def _convert_text(spec_field: Field, value: Any, where: _Where) -> Any:
    """The string kinds (str, path, time, hostlist, choice): non-empty, no control characters, then each
    kind's and each key's own rule."""
    if not isinstance(value, str) or not value:
        raise _bad(spec_field, value, where, "a non-empty string")
    if _has_control(value):
        raise _bad(spec_field, value, where, "a string without control characters (newlines, tabs, DEL)")
    kind = spec_field.kind
    if kind == "time":
        try:
            slurm_time_seconds(value)
        except ValueError as exc:
            raise _bad(spec_field, value, where, str(exc)) from None
    if spec_field.dotted == "job.name" and len(value.encode()) > MAX_JOB_NAME_BYTES:
        raise _bad(spec_field, value, where, f"a name of at most {MAX_JOB_NAME_BYTES} bytes (Slurm keeps no more)")
    if spec_field.dotted == "job.data_version" and (len(value) > MAX_DATA_VERSION or not value.isprintable()):
        raise _bad(spec_field, value, where,
                   f"a label of at most {MAX_DATA_VERSION} printable characters (no invisible formatting "
                   "characters: bidirectional overrides, zero-width or non-breaking spaces)")
    if kind == "choice" and value not in spec_field.choices:
        close = difflib.get_close_matches(value, list(spec_field.choices), n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise where.error(f"expected one of {', '.join(spec_field.choices)}, found {value!r}{hint}",
                          spec_field.section, spec_field.key)
    if kind == "path" and value.startswith("-"):
        raise _bad(spec_field, value, where, f"a path, not an option (write './{value}' for one really named so)")
    if kind == "hostlist":
        try:
            hostlist.expand(value)
        except HostlistError as exc:
            raise _bad(spec_field, value, where, f"a Slurm hostlist ({exc})") from None
    _check_text_key(spec_field, value, where)
    return value


def _check_text_key(spec_field: Field, value: str, where: _Where) -> None:
    """The rules of single string keys: the webhook URL, the resume variable, the progress pattern, the Python."""
    if spec_field.key == "webhook" and not re.match(r"^https?://[^/\s]+", value):
        raise _bad(spec_field, value, where, "an http(s) URL like https://hooks.example.com/...")
    if spec_field.kind == "str" and spec_field.key == "resume_env" and not ENV_NAME.match(value):
        raise _bad(spec_field, value, where, "an environment variable name (letters, digits, _)")
    if spec_field.key == "progress_pattern":
        try:
            groups = re.compile(value).groups
        except (re.error, RecursionError, OverflowError) as exc:
            raise _bad(spec_field, value, where, f"a regular expression ({exc})") from None
        if not groups:
            raise _bad(spec_field, value, where, "a regular expression with a group around the step number, like "
                       "'step (\\d+)' or 'it=(?P<step>\\d+)' (the group named `step`, else the first, is read as "
                       "the step)")
    if spec_field.dotted == "launch.python" and not value.startswith("/"):
        raise _bad(spec_field, value, where, "an absolute path to a Python with clusterctl installed, as the compute "
                   "nodes see it, like '/shared/venv/bin/python' (a relative path or a bare name would be looked "
                   "up from wherever the job starts)")


def _convert_switches(spec_field: Field, value: Any, where: _Where) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_NODES):
        return value
    raise _bad(spec_field, value, where, "'auto' or a whole number of switches (0 = don't ask)")


def _convert_strings(spec_field: Field, value: Any, where: _Where) -> Any:
    """argv and strings: a list of strings, argv non-empty when required."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad(spec_field, value, where, "a list of strings")
    if spec_field.kind == "argv" and spec_field.required and not value:
        raise _bad(spec_field, value, where, "a non-empty list of strings (the program and its arguments)")
    if any("\0" in item for item in value):
        raise _bad(spec_field, value, where, "strings without NUL characters")
    return tuple(value)


def _convert_env(spec_field: Field, value: Any, where: _Where) -> Any:
    if not isinstance(value, dict):
        raise _bad(spec_field, value, where, "a table of NAME = 'value'")
    pairs = []
    for name, item in value.items():
        if not ENV_NAME.match(name):
            raise where.error(f"`{name}` is not a valid environment variable name (letters, digits, _; not "
                              "starting with a digit)", spec_field.section, spec_field.key)
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise where.error(f"value of {name} must be a string, found {_describe(item)}",
                              spec_field.section, spec_field.key)
        if "\0" in str(item):
            raise where.error(f"value of {name} contains a NUL character", spec_field.section, spec_field.key)
        pairs.append((name, str(item)))
    return tuple(pairs)


def _convert_exit_actions(spec_field: Field, value: Any, where: _Where) -> Any:
    if not isinstance(value, dict):
        raise _bad(spec_field, value, where, "a table like {75 = 'restart', 77 = 'stop'}")
    actions: list[tuple[int, str]] = []
    for code, action in value.items():
        if not code.isdigit() or not 1 <= int(code) <= 255:
            raise where.error(f"exit code `{code}` must be a number from 1 to 255", spec_field.section,
                              spec_field.key)
        if action not in EXIT_ACTIONS:
            raise where.error(f"exit code {code}: action must be one of {', '.join(EXIT_ACTIONS)}, found "
                              f"{_describe(action)}", spec_field.section, spec_field.key)
        actions.append((int(code), action))
    return tuple(sorted(actions))


def _convert_weights(spec_field: Field, value: Any, where: _Where) -> Any:
    if not isinstance(value, dict):
        raise _bad(spec_field, value, where, "a table like {dp = 2.0, pp = 1.0}")
    weights: list[tuple[str, float]] = []
    for name, item in value.items():
        if name not in DIMS:
            raise where.error(f"unknown group kind `{name}`" + _did_you_mean(name, DIMS),
                              spec_field.section, spec_field.key)
        if isinstance(item, bool) or not isinstance(item, int | float) or not 0 <= item <= 1e6:
            raise where.error(f"weight of {name} must be a number from 0 to 1e6, found {_describe(item)}",
                              spec_field.section, spec_field.key)
        weights.append((name, float(item)))
    return tuple(weights)


_CONVERTERS: dict[str, Callable[[Field, Any, _Where], Any]] = {
    "int": _convert_int, "bool": _convert_bool, "float": _convert_float,
    "str": _convert_text, "path": _convert_text, "time": _convert_text, "hostlist": _convert_text,
    "choice": _convert_text, "switches": _convert_switches, "argv": _convert_strings, "strings": _convert_strings,
    "env": _convert_env, "exit_actions": _convert_exit_actions, "weights": _convert_weights,
}
"""One converter per field kind: each checks a TOML value and returns what the dataclass holds."""


def _convert(spec_field: Field, value: Any, where: _Where) -> Any:
    """The value of `spec_field` checked and converted by its kind's converter (SpecError when wrong)."""
    converter = _CONVERTERS.get(spec_field.kind)
    if converter is None:
        raise AssertionError(spec_field.kind)
    return converter(spec_field, value, where)


def managed_option(option: str) -> str | None:
    """The managed sbatch option `option` would set (`-N2` and `--node=2` set --nodes), or None."""
    if option.startswith("--"):
        name = option.split("=", 1)[0].split(" ", 1)[0]
        if name in MANAGED_SBATCH:
            return name
        if len(name) > 2 and name not in UNMANAGED_PREFIXES:
            return next((m for m in MANAGED_SBATCH if m.startswith("--") and m.startswith(name)), None)
        return None
    short = option[:2]  # getopt: `-N2`, `-N 2` and `-N=2` all give -N
    return short if short in MANAGED_SBATCH else None


def _check_sbatch_options(options: tuple[str, ...], where: _Where) -> None:
    for option in options:
        if not option.startswith("-"):
            raise where.error(f"{option!r} is not an option; write each as '--name=value'", "job", "sbatch_options")
        name = managed_option(option)
        if name is not None:
            raise where.error(f"{name} is set by clusterctl from other keys (job.nodes, job.time, ...); "
                              "use those keys instead", "job", "sbatch_options")
        if any(ord(c) < 32 for c in option):
            raise where.error(f"{option!r} contains control characters", "job", "sbatch_options")


SRUN_INPUT_VARIABLES = frozenset({
    "SLURM_CPU_BIND", "SLURM_MEM_BIND", "SLURM_GPU_BIND", "SLURM_TRES_BIND", "SLURM_MPI_TYPE", "SLURM_HINT",
    "SLURM_NETWORK", "SLURM_CPU_FREQ_REQ", "SLURM_GPU_FREQ", "SLURM_DEBUG"})
"""srun's own input variables (srun(1), INPUT ENVIRONMENT VARIABLES) that say how the step's tasks are bound
and wired, none of which clusterctl sets or its rank map depends on (SLURM_DISTRIBUTION would move tasks off
the map's nodes: refused with the rest): a site's or user's way to tune srun, kept."""


def owned_variable(name: str, resume_env: str = DEFAULT_RESUME_ENV) -> str | None:
    """Why [launch] env may not set `name` (Slurm, torchrun or clusterctl sets it, or it would reach clusterctl's
    own processes), as the rest of a sentence about it; None when the spec may set it."""
    if name in SRUN_INPUT_VARIABLES:
        return None
    if name.startswith(("SLURM_", "SLURMD_")):
        return ("is Slurm's: it sets SLURM_* for the job and each step, and a value here would replace its own where "
                "clusterctl's agent and srun read them (the job's id, its nodes, srun's options); ask Slurm through "
                "job.sbatch_options")
    if name in RANK_VARIABLES or name in TORCHRUN_VARIABLES or name.startswith("TORCHELASTIC_"):
        how = "; to choose the rendezvous port, set launch.master_port" if name == "MASTER_PORT" else ""
        return ("is set for each rank by the launcher from the rank map (by torchrun in its style), so a value here "
                f"never reaches the program: remove it{how}")
    if name == "LD_PRELOAD":
        return ("would be preloaded into clusterctl's own agent, node reporter and srun, not only into the program; "
                "to preload into the program alone, start it through env: command = ['env', "
                "'LD_PRELOAD=/path/lib.so', 'python3', 'train.py']")
    if name in STEP_VARIABLES:
        return ("is set by clusterctl's agent for each step (where the job's records, node directory, report inbox "
                "or checkpoint tiers are): remove it")
    if name == "CLUSTERCTL_CHECKPOINT_DIR":
        return "is set by clusterctl from checkpoint.dir: set that key instead"
    if name in {f"CLUSTERCTL_{dim.upper()}" for dim in DIMS} or name in DATA_PARALLEL_VARIABLES:
        return "is set by clusterctl from [parallel]: set the size there instead"
    if name == resume_env:
        return ("carries the checkpoint a resume starts from (checkpoint.resume_env) and is set by clusterctl on "
                "every resume: remove it (to start from a checkpoint of your choosing: clusterctl submit --resume "
                "PATH)")
    return None


def _check_launch_env(values: dict[str, dict[str, Any]], overrides: Overrides, where: _Where) -> None:
    """[launch] env (and -e/--env) sets no variable Slurm, torchrun or clusterctl owns (owned_variable)."""
    given_on_command_line = {name for name, _ in overrides.env}
    for name, _ in values["launch"]["env"]:
        why = owned_variable(name, values["checkpoint"]["resume_env"])
        if why is None:
            continue
        if name in given_on_command_line:
            raise SpecError(f"{name} {why}", path="command line", key="-e/--env")
        number = where.line("launch.env", name) or where.line("launch", "env")
        raise SpecError(f"{name} {why}", path=f"{where.path}:{number}" if number else where.path,
                        key=f"launch.env.{name}")


def _check_placeholders(values: Sequence[str], known: Sequence[str], where: _Where, section: str, key: str) -> None:
    """A `{name}` close to a known placeholder is a typo: it would reach the program literally."""
    for value in values:
        for name in _BRACED.findall(value):
            if name in known:
                continue
            close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
            if close or name.lower() in known:
                raise where.error(f"unknown placeholder {{{name}}} in {value!r}; did you mean "
                                  f"{{{close[0] if close else name.lower()}}}? (known: "
                                  + ", ".join("{" + k + "}" for k in known) + ")", section, key)


def _resolve(path: str | None, base: Path, key: str = "") -> str | None:
    if path is None or path.startswith(RUN_DIR_PLACEHOLDER):
        return path
    try:
        return str((base / Path(path).expanduser()).resolve())
    except (OSError, RuntimeError) as exc:  # a path through /proc/<pid>/root, a symlink loop
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "a symlink loop"
        raise SpecError(f"cannot follow the path {path!r} ({why}); give a path this user can reach",
                        key=key or None) from None


def fill_data_parallel(parallel: Mapping[str, Any], gpus: int) -> tuple[int, int | None]:
    """The rule for an unset dp: whatever fills the GPUs.  (tp×cp×pp, dp), dp None when tp×cp×pp
    does not divide `gpus`."""
    rest = 1
    for dim in ("tp", "cp", "pp"):
        rest *= int(parallel.get(dim, 1))
    return rest, (gpus // rest if rest >= 1 and gpus % rest == 0 else None)


def parse_spec(text: str, path: str = "spec.toml", overrides: Overrides = Overrides(),
               base_dir: Path | None = None) -> JobSpec:
    """Parse and validate a spec; relative paths resolve against `base_dir` (the spec's folder)."""
    where = _Where(text, path)
    data = _read_toml(text, path)
    _check_known_keys(data, where)
    values = _field_values(data, where)
    _check_sbatch_options(values["job"]["sbatch_options"], where)
    _check_command_placeholders(values, where)
    _apply_overrides(values, overrides)
    _check_launch_env(values, overrides, where)
    _check_tiers(values, where)
    _resolve_paths(values, base_dir or Path(path).resolve().parent)
    layout = _parallel_layout(values, where, path)
    _check_restart_and_stragglers(values, where)
    _check_shrink_floor(values, layout, where)
    return JobSpec(JobSection(**values["job"]), LaunchSection(**values["launch"]), layout, PlacementSection(**values["placement"]),
                   CheckpointSection(**values["checkpoint"]), RestartSection(**values["restart"]), path,
                   StragglerPolicy(**values["stragglers"]))


def _read_toml(text: str, path: str) -> dict[str, Any]:
    """The TOML tables of the spec (SpecError when the text is not TOML)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"not valid TOML: {exc}", path=path) from None
    except RecursionError:
        raise SpecError("not valid TOML: nested too deeply", path=path) from None


def _check_known_keys(data: Mapping[str, Any], where: _Where) -> None:
    """Every section is known and a table, every key in it known (with a "did you mean")."""
    for section, table in data.items():
        if section not in SECTIONS:
            raise where.error(f"unknown section [{section}]" + _did_you_mean(section, SECTIONS), section)
        if not isinstance(table, dict):
            raise where.error(f"[{section}] must be a table", section)
        for key in table:
            if key not in _BY_SECTION[section]:
                raise where.error(f"unknown key `{key}` in [{section}]" + _did_you_mean(key, list(_BY_SECTION[section])),
                                  section, key)


def _field_values(data: Mapping[str, Any], where: _Where) -> dict[str, dict[str, Any]]:
    """Section → key → converted value for every field in FIELDS order: the given value, else the default
    (an unset [parallel] key stays unset: the layout fills dp)."""
    values: dict[str, dict[str, Any]] = {}
    for spec_field in FIELDS:
        table = data.get(spec_field.section, {})
        if spec_field.key in table:
            value = _convert(spec_field, table[spec_field.key], where)
        elif spec_field.required:
            raise where.error(f"missing; {spec_field.doc}", spec_field.section, spec_field.key)
        elif spec_field.section == "parallel":
            continue
        else:
            value = tuple(spec_field.default) if isinstance(spec_field.default, list | tuple) else spec_field.default
            if isinstance(value, dict):
                value = ()
        values.setdefault(spec_field.section, {})[spec_field.key] = value
    return values


def _check_command_placeholders(values: dict[str, dict[str, Any]], where: _Where) -> None:
    """Placeholders are known, and the ones the command uses have the keys they stand for."""
    _check_placeholders(values["launch"]["command"], COMMAND_PLACEHOLDERS, where, "launch", "command")
    _check_placeholders(values["checkpoint"]["resume_args"], RESUME_PLACEHOLDERS, where, "checkpoint", "resume_args")
    _check_placeholders([values["checkpoint"]["dir"] or ""], ("run_dir",), where, "checkpoint", "dir")
    if values["job"]["total_steps"] is None and any("{total_steps}" in arg for arg in values["launch"]["command"]):
        raise where.error("uses {total_steps}, but [job] total_steps is not set (it would reach the program "
                          "literally): set job.total_steps, e.g. 10000, or drop the placeholder", "launch", "command")
    if values["checkpoint"]["dir"] is None and any("{checkpoint_dir}" in arg for arg in values["launch"]["command"]):
        raise where.error("uses {checkpoint_dir}, but [checkpoint] dir is not set (it would become an empty "
                          "argument): set checkpoint.dir, e.g. '{run_dir}/checkpoints', or drop the placeholder",
                          "launch", "command")


def _resolve_paths(values: dict[str, dict[str, Any]], base: Path) -> None:
    """Relative paths against `base` (the spec's folder); `{run_dir}/...` stays for the run to fill."""
    job = values["job"]
    job["runs_dir"] = _resolve(job["runs_dir"], base, "job.runs_dir")
    launch = values["launch"]
    launch["workdir"] = _resolve(launch["workdir"], base, "launch.workdir")
    launch["template"] = _resolve(launch["template"], base, "launch.template")
    values["placement"]["topology"] = _resolve(values["placement"]["topology"], base, "placement.topology")
    values["checkpoint"]["dir"] = _resolve(values["checkpoint"]["dir"], base, "checkpoint.dir")


def _parallel_layout(values: dict[str, dict[str, Any]], where: _Where, path: str) -> ParallelLayout:
    """The [parallel] layout, dp filled when unset, checked to use exactly the job's GPUs."""
    job = values["job"]
    parallel = dict(values.get("parallel", {}))
    gpus = job["nodes"] * job["gpus_per_node"]
    if "dp" not in parallel:
        rest, dp = fill_data_parallel(parallel, gpus)
        if dp is None:
            raise where.error(f"tp×cp×pp = {rest} does not divide the job's {gpus} GPUs ({job['nodes']} nodes × "
                              f"{job['gpus_per_node']}); change [parallel] or job.nodes", "parallel")
        parallel["dp"] = dp
    try:
        layout = layout_from_mapping(parallel, where=f"{path} [parallel]")
    except LayoutError as exc:
        raise SpecError(str(exc).removeprefix(f"{path} [parallel]: "), path=path, key="parallel") from None
    if layout.world_size != gpus:
        raise where.error(f"the layout needs {layout.world_size} GPUs (tp×pp×dp×cp = {layout.world_size}) but the job "
                          f"has {gpus} ({job['nodes']} nodes × {job['gpus_per_node']}); make them equal", "parallel")
    try:  # NVLink domains may span nodes (declared where the job plans), so only the node's own GPUs are checked
        validate_for_cluster(layout, nodes=job["nodes"], gpus_per_node=job["gpus_per_node"],
                             nodes_per_nvlink_domain=job["nodes"])
    except LayoutError as exc:
        raise where.error(str(exc), "parallel") from None
    return layout


def _check_restart_and_stragglers(values: dict[str, dict[str, Any]], where: _Where) -> None:
    """Rules across keys: the backoff cap is not below the backoff, a straggler swap has spares."""
    if values["restart"]["backoff_max_seconds"] < values["restart"]["backoff_seconds"]:
        raise where.error("must be at least restart.backoff_seconds", "restart", "backoff_max_seconds")
    if values["stragglers"]["action"] == "swap" and not values["job"]["spare_nodes"]:
        raise where.error("`swap` needs spare nodes to swap in: set job.spare_nodes, or use `exclude` (avoid the "
                          "node from the next resubmission on) or `report`", "stragglers", "action")


def _check_shrink_floor(values: dict[str, dict[str, Any]], layout: ParallelLayout, where: _Where) -> None:
    """restart.min_data_parallel: parallel.dp when unset (never shrink), else a size the layout can shrink to."""
    restart = values["restart"]
    floor = restart["min_data_parallel"]
    if floor is None:
        restart["min_data_parallel"] = layout.dp
        return
    if floor > layout.dp:
        raise where.error(f"is {floor}, above parallel.dp = {layout.dp}: a job shrinks, it never grows past its "
                          f"spec; set at most {layout.dp} ({layout.dp}: never shrink)", "restart", "min_data_parallel")
    if floor == layout.dp:
        return
    if values["checkpoint"]["tiers"]:
        # slot_sources gives each slot of the new map the part of one slot of the saving map: a smaller map
        # has fewer slots than parts, and its step would start from its beginning (or, worse, resume wrong).
        raise where.error(f"is {floor}, below parallel.dp = {layout.dp}, with checkpoint.tiers = true: a tiered "
                          "checkpoint is one part per node of the map that saved it, and a shrunk job's map has "
                          f"fewer nodes to give them to; set restart.min_data_parallel = {layout.dp} (never shrink) "
                          "or turn checkpoint.tiers off", "restart", "min_data_parallel")
    sizes = shrink_sizes(layout, values["job"]["gpus_per_node"], floor)
    if floor not in sizes:
        reachable = shrink_sizes(layout, values["job"]["gpus_per_node"], 1)
        replica = layout.tp * layout.cp * layout.pp
        why = (f"one DP replica is tp×cp×pp = {replica} GPUs, so dp = {floor} leaves {replica * floor} GPUs, not "
               f"whole nodes of {values['job']['gpus_per_node']}" if replica * floor % values["job"]["gpus_per_node"]
               else f"ep = {layout.ep} does not divide cp×dp = {layout.cp * floor}" if layout.ep > 1 and
               layout.cp * floor % layout.ep else "that layout does not fit the nodes")
        choose = (f"choose one of {', '.join(map(str, reachable))}" if reachable
                  else "this layout cannot shrink at all")
        raise where.error(f"the job cannot shrink to dp = {floor} ({why}); {choose}, or {layout.dp} (never shrink)",
                          "restart", "min_data_parallel")


OVERRIDDEN = ("nodes", "gpus_per_node", "time", "partition", "account", "qos", "name", "exclude")
"""The [job] keys the command line sets by name (--nodes, --qos, ...)."""


def _apply_overrides(values: dict[str, dict[str, Any]], overrides: Overrides) -> None:
    job = values["job"]
    for key, value in overrides.defaults:
        if job.get(key) is None:
            job[key] = value
    for key in OVERRIDDEN:
        value = getattr(overrides, key)
        if value is not None:
            job[key] = value
    job["sbatch_options"] = (*job["sbatch_options"], *overrides.sbatch_options)
    if overrides.env:
        env = dict(values["launch"]["env"])
        env.update(overrides.env)
        values["launch"]["env"] = tuple(env.items())


def load_spec(path: Path, overrides: Overrides = Overrides()) -> JobSpec:
    """Read and parse a spec file (SpecError when it cannot be read)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror}; check the path", path=str(path)) from None
    except UnicodeDecodeError:
        raise SpecError("not UTF-8 text; a job spec is a TOML file", path=str(path)) from None
    return parse_spec(text, str(path), overrides, path.resolve().parent)


def parse_overrides(*, nodes: int | None = None, gpus_per_node: int | None = None, time: str | None = None,
                    partition: str | None = None, account: str | None = None, qos: str | None = None,
                    name: str | None = None, exclude: str | None = None, env: Sequence[str] = (),
                    sbatch_options: Sequence[str] = (),
                    defaults: Sequence[tuple[str, str]] = ()) -> Overrides:
    """Validate command-line overrides with the same rules as the file (errors name the option).

    `sbatch_options` are KEY=VALUE (or KEY) pairs, each becoming `--KEY=VALUE`; `defaults` are already
    checked (launcher/pure/submit_defaults.py)."""
    where = _Where("", "command line")
    checked: dict[str, Any] = {}
    given = dict(zip(OVERRIDDEN, (nodes, gpus_per_node, time, partition, account, qos, name, exclude)))
    for key, value in given.items():
        if value is not None:
            try:
                checked[key] = _convert(_BY_SECTION["job"][key], value, where)
            except SpecError as exc:
                raise SpecError(str(exc).split(": ", 1)[-1], path="command line",
                                key=f"--{key.replace('_', '-')}") from None
    options = tuple(sbatch_option(item) for item in sbatch_options)
    pairs = []
    for item in env:
        name_, sep, value_ = item.partition("=")
        if not sep or not ENV_NAME.match(name_):
            raise SpecError(f"expected NAME=VALUE with a valid variable name, found {item!r}", path="command line",
                            key="-e/--env")
        pairs.append((name_, value_))
    return Overrides(env=tuple(pairs), sbatch_options=options, defaults=tuple(defaults), **checked)


def check_job_value(key: str, value: Any, path: str, text: str = "") -> Any:
    """`value` for [job] `key` under the spec's rules, from a file other than a spec whose `text` is given
    (SpecError names the file, line and key)."""
    return _convert(_BY_SECTION["job"][key], value, _Where(text, path))


def sbatch_option(item: str) -> str:
    """`--sbatch-option KEY=VALUE` (or KEY, a flag) as the sbatch option `--KEY=VALUE`; SpecError naming
    the option when it is not one, or is one clusterctl sets from the spec's keys."""
    name, sep, value = item.removeprefix("--").partition("=")
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name) or _has_control(value):
        raise SpecError(f"expected KEY=VALUE with an sbatch long option name as KEY (constraint=h100, "
                        f"mem=0, exclusive), found {item!r}", path="command line", key="--sbatch-option")
    option = f"--{name}{sep}{value}"
    managed = managed_option(option)
    if managed is not None:
        raise SpecError(f"{managed} is set by clusterctl from the spec's [job] keys: use those, or their options "
                        "(--nodes, --time, --partition, --account, --name, --exclude)", path="command line",
                        key="--sbatch-option")
    return option


def default_runs_dir(environ: Mapping[str, str] = os.environ) -> str:
    """$CLUSTERCTL_RUNS or ~/.clusterctl/runs."""
    return environ.get("CLUSTERCTL_RUNS") or str(Path("~/.clusterctl/runs").expanduser())


def with_job(spec: JobSpec, **changes: Any) -> JobSpec:
    """A copy of the spec with [job] fields changed (the supervisor's exclusions, for one)."""
    return replace(spec, job=replace(spec.job, **changes))


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every field, in file order: the spec reference."""
    rows = []
    for spec_field in FIELDS:
        kind = spec_field.kind if spec_field.kind != "choice" else " | ".join(spec_field.choices)
        if spec_field.required:
            default = "required"
        elif spec_field.default in (None, (), {}):
            default = "-"
        else:
            default = repr(spec_field.default) if isinstance(spec_field.default, str) else str(spec_field.default)
        rows.append((spec_field.dotted, kind, default, spec_field.doc))
    return rows
