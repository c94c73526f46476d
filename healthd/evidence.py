"""`healthd evidence`: what this node's GPUs say now, as the record a slow job's agent reads.

`gpu_evidence` (pure) joins NVML samples with healthd's current findings into a
clusterctl.records.gpu_evidence record; `sample_gpus` reads the samples through the NVML door it
is given (an `NvmlReader`: healthd.nvml.Nvml, every call under a timeout) and `read_evidence` adds healthd's state
file.  It only reads: the job's user runs it, as a step on the node.  Which GPUs it reads is a
`GpuScope`: every GPU (an admin's look), those of `--gpus`, or a job step's own (`job_gpus`, what a
job's straggler action asks for, so that a node shared with other jobs never shows their GPUs to this
job's user nor lets their slowdown explain this job's).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.healthd.gpu_sample import GpuSample
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.gate import gpu_index_list, read_state
from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading
from clusterctl.records.healthd_state import HealthdState

if TYPE_CHECKING:
    from clusterctl.healthd.nvml import NvmlReader


STEP_GPUS = "SLURM_STEP_GPUS"
"""The variable that names a job step's GPUs on the node the task runs on (see `job_gpus`)."""


@dataclass(frozen=True)
class GpuScope:
    """Which of the node's GPUs to read (`gpus`, NVML indexes; None: every GPU NVML counts), why, as the
    record's `scope` says it, and the problem line when it names none to read."""

    gpus: tuple[int, ...] | None
    why: str
    problem: str | None = None


EVERY_GPU = GpuScope(None, "every GPU of the node")


def chosen_gpus(gpus: Collection[int]) -> GpuScope:
    """The GPUs given with `--gpus`."""
    chosen = tuple(sorted(set(gpus)))
    return GpuScope(chosen, f"GPU {_indexes(chosen)}: those asked for (--gpus)")


def job_gpus(environ: Mapping[str, str]) -> GpuScope:
    """The GPUs the job step running this has on this node, from SLURM_STEP_GPUS in `environ`.

    slurmstepd sets SLURM_STEP_GPUS in each task of a step to the step's GPUs on the task's node, and
    an `srun --overlap` step is given all of the job's GPUs there (seen on 22.05 and 26.05, from the
    batch script and from a login node; in a job without GPUs it is unset, even when the caller's
    environment had it).  Not SLURM_JOB_GPUS: srun hands its caller's environment on, so a step started
    from the batch script carries the batch host's SLURM_JOB_GPUS to every other node (seen on 22.05
    and 26.05: `4,5,6,7` on a node where the job had 2,3,4,5).  Not CUDA_VISIBLE_DEVICES: it holds what the task's CUDA sees,
    which Slurm numbers from 0 when ConstrainDevices hides the node's other GPUs (the testbed cannot
    constrain devices: not seen here).

    Relied on: Slurm's GPU index i (the i-th device of the node's gres.conf `File=` list) is NVML's
    index i, as with AutoDetect=nvml or `File=/dev/nvidia[0-7]` over GPUs whose minor numbers follow
    NVML's order (the testbed's emulated NVML: nvidia0..7 are NVML's 0..7).  An index NVML does not
    count is a problem line of the record, never a guess.

    Slurm sets the variable in the step over whatever the caller's environment had (22.05, 26.05).
    It is still the job user's environment, which is enough here: what is read is never more than the
    GPUs it names (never "every GPU" for want of a list), and the only user who could change it runs
    the job's agent anyway.  A value that is not a GPU list, or none at all (a job without GPUs on this
    node), reads no GPU and says why in `problem`.
    """
    value = environ.get(STEP_GPUS)
    if not value:
        return GpuScope((), f"no GPU: {STEP_GPUS} is not set (no GPUs of this job on this node)",
                        f"{STEP_GPUS} is not set: Slurm names no GPU of this job on this node, so no GPU was "
                        f"read (the other GPUs are other jobs')")
    try:
        gpus = gpu_index_list(value)
    except ValueError as exc:
        shown = value if len(value) <= 60 else value[:60] + "..."
        return GpuScope((), f"no GPU: {STEP_GPUS} is not a GPU list",
                        f"{STEP_GPUS}={shown!r} is not a GPU list: {exc}; no GPU was read")
    return GpuScope(tuple(gpus), f"GPU {_indexes(gpus)}: this job's on this node ({STEP_GPUS})")


def gpu_evidence(node: str, at: float, samples: Sequence[GpuSample], state: HealthdState | None,
                 problems: Sequence[str] = (), scope: str = "") -> GpuEvidence:
    """The evidence record of `node` from its GPUs' `samples` and healthd's `state` (None: not readable)."""
    held = {gpu.index: gpu.findings for gpu in state.gpus} if state is not None else {}
    readings = []
    for sample in samples:
        findings = tuple(f"{f.what}: {f.reason} ({f.action.label})" for f in held.get(sample.index, ())
                         if not f.acknowledged)
        if sample.lost:
            findings = ("gpu-lost: NVML says the GPU is lost",) + findings
        readings.append(GpuReading(sample.index, sample.uuid, sample.clock_event_reasons, sample.sm_clock_mhz,
                                   sample.sm_clock_max_mhz, sample.temperature_c, sample.ecc_volatile_sbe,
                                   sample.ecc_volatile_dbe, sample.remap_pending, findings))
    return GpuEvidence(node, at, tuple(readings), tuple(problems), scope)


def current_state(state: HealthdState | None, at: float, max_age: float) -> tuple[HealthdState | None, str | None]:
    """`state` when healthd wrote it within `max_age` seconds of `at`; else None and why (the findings
    of a daemon that stopped are no longer current, and must not make a node look slowed)."""
    if state is None or at - state.updated_at <= max_age:
        return state, None
    return None, (f"healthd's state is {at - state.updated_at:.0f} s old (is healthd running on this node?): "
                  f"its findings are left out")


def sample_gpus(nvml: NvmlReader, gpus: Collection[int] | None = None) -> tuple[list[GpuSample], list[str]]:
    """Sample every GPU NVML counts (or those of `gpus`) through `nvml`, and one problem line per GPU
    that could not be read or is not there.

    Raises NvmlError / NvmlHang when NVML cannot be opened or cannot count the GPUs at all.
    """
    from clusterctl.healthd.nvml import NvmlError, NvmlHang

    problems: list[str] = []
    samples: list[GpuSample] = []
    nvml.init()
    try:
        count = nvml.count()
        asked = sorted(set(gpus)) if gpus is not None else list(range(count))
        if absent := [i for i in asked if i >= count]:
            problems.append(f"GPU {_indexes(absent)}: not on this node (NVML counts {count} GPUs)")
        asked = [i for i in asked if i < count]
        try:
            nvml.discover()  # the UUIDs; a GPU it cannot identify is still sampled below
        except NvmlHang as exc:
            # The driver is stuck: every further call would be refused (or wait out its own timeout).
            problems.append(f"NVML: {exc}")
            if asked:
                problems.append(f"GPU {_indexes(asked)}: not read (NVML hung while identifying the GPUs)")
            return samples, problems
        except NvmlError as exc:
            problems.append(f"NVML: cannot identify every GPU: {exc}")
        for position, index in enumerate(asked):
            try:
                # Every enumerated index, not only the identified ones: a lost GPU is evidence too.
                samples.append(nvml.sample(index))
            except NvmlHang as exc:
                problems.append(f"GPU {index}: NVML: {exc}")
                if rest := asked[position + 1:]:
                    problems.append(f"GPU {_indexes(rest)}: not read (NVML hung on GPU {index})")
                break
            except NvmlError as exc:
                problems.append(f"GPU {index}: NVML: {exc}")
    finally:
        nvml.shutdown()
    return samples, problems


def _indexes(indexes: Sequence[int]) -> str:
    return ",".join(map(str, indexes))


def read_evidence(nvml: NvmlReader, config: HealthdConfig, at: float, scope: GpuScope = EVERY_GPU) -> GpuEvidence:
    """This node's GPUs of `scope` read through `nvml` now, joined with healthd's state file.

    Raises NvmlError / NvmlHang when NVML cannot be used at all; a GPU or a state file that
    cannot be read is a problem line of the record instead (the daemon may not run).  A scope of no
    GPU opens neither NVML nor the state file: the record is its problem line.
    """
    problems = [scope.problem] if scope.problem else []
    if scope.gpus == ():
        return gpu_evidence(config.node_name, at, [], None, problems, scope.why)
    samples, unread = sample_gpus(nvml, scope.gpus)
    problems += unread
    state, unusable = read_state(config)
    if unusable:
        problems.append(unusable)
    elif state is None:
        problems.append(f"no healthd state in {config.state_dir} (is healthd running on this node?)")
    # By age only (gate.state_is_fresh's limit): a job's user may not see healthd's process (hidepid).
    state, stale = current_state(state, at, max(3 * config.check_interval, 30.0))
    if stale:
        problems.append(stale)
    return gpu_evidence(config.node_name, at, samples, state, problems, scope.why)
