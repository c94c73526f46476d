"""A job's training metrics from its nodes' reports: steps/s, tokens/s, FLOP/s, MFU, loss.  (pure)

Each rank says what it did (`clusterctl.progress.beat(step, tokens=..., flops=..., loss=...,
grad_norm=...)`); its node's reporter sums the node's ranks into one `NodeMetrics` per report
(clusterctl.records.node_report); the agent keeps, per node, the samples of the last `window`
seconds (`TrainingMeter.observe`, once per summary interval, not per report) and reads the job's
figures from them (`TrainingMeter.reading`):

- a node's rate is its counters' growth between its oldest and newest sample in the window, over the
  growth of the samples' own times (that node's clock: nodes' clocks are never compared);
- the job's tokens/s and FLOP/s are the sum over the nodes heard within the window, steps/s the
  median of the nodes' step rates;
- a node whose ranks restarted (another set of processes: `NodeMetrics.epoch`) or whose counters went
  down is measured afresh from its next sample, so a restart never shows as negative throughput, and
  a node that joins (a spare after a recovery) counts from its second report;
- MFU = FLOP/s / (the step's GPUs x the GPUs' peak): the peak from the spec's `[job] gpu_peak_tflops`,
  else from NVML's device name (`PEAK_TFLOPS`), else none, with why (`job_peak`).

Nothing here runs: the agent passes in what its reports said and its clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from clusterctl.records.agent_summary import TrainingMetrics
from clusterctl.records.node_report import NodeMetrics

MIN_WINDOW_SECONDS = 30.0

# Dense BF16 tensor-core TFLOP/s per GPU (the datasheets quote twice these, "with sparsity"), by what
# NVML's device name contains, the more specific first ("GB200" holds "B200", "H100 NVL" holds "H100").
# The same figures as torchtitan's get_peak_flops (torchtitan/tools/utils.py).  Sources:
#   A100 (SXM and PCIe): 312 -- NVIDIA A100 datasheet, "BF16 Tensor Core 312 TFLOPS | 624 TFLOPS*"
#     (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)
#   H100 SXM 989, NVL 835, PCIe 756 -- NVIDIA H100 datasheet, BF16 1,979* / 1,671* / 1,513* with sparsity
#     (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet); NVML names the SXM5
#     part "NVIDIA H100 80GB HBM3"
#   H200 SXM 989, NVL 835 -- NVIDIA H200 datasheet, BF16 1,979* / 1,671* with sparsity
#   B200 2,250 -- NVIDIA HGX B200: FP16/BF16 36 PFLOPS* for 8 GPUs with sparsity (nvidia.com/en-us/data-center/hgx/)
#   GB200 2,500 -- NVIDIA GB200 NVL72: FP16/BF16 360 PFLOPS* for 72 GPUs with sparsity
#     (nvidia.com/en-us/data-center/gb200-nvl72/)
PEAK_TFLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("GB200",), 2500.0),
    (("B200",), 2250.0),
    (("H200", "NVL"), 835.0),
    (("H200",), 989.0),
    (("H100", "NVL"), 835.0),
    (("H100", "PCIE"), 756.0),
    (("H100",), 989.0),
    (("A100",), 312.0),
)


def window_seconds(heartbeat: float) -> float:
    """How far back the rates look: three heartbeats (each node's counters arrive once per heartbeat),
    at least MIN_WINDOW_SECONDS."""
    return max(MIN_WINDOW_SECONDS, 3 * heartbeat)


def table_peak(gpu: str) -> float | None:
    """The dense BF16 TFLOP/s of the GPU NVML names `gpu` (PEAK_TFLOPS), None when it is not there."""
    name = gpu.upper()
    return next((tflops for words, tflops in PEAK_TFLOPS if all(w in name for w in words)), None)


@dataclass(frozen=True)
class Peak:
    """The GPUs' peak MFU is measured against: TFLOP/s per GPU and its source, or None and why not."""

    tflops: float | None
    source: str = ""  # "spec", "nvml" or "" (none)
    gpu: str = ""
    """The GPU model the nodes' NVML names ("" none, or several)."""
    missing: str = ""


def job_peak(spec_tflops: float | None, gpu_names: Iterable[str]) -> Peak:
    """The peak per GPU: the spec's `[job] gpu_peak_tflops` when set, else the table's for the one GPU
    model the nodes name; else none, saying why (no model named, several, one not in the table)."""
    names = sorted({name for name in gpu_names if name})
    gpu = names[0] if len(names) == 1 else ""
    if spec_tflops is not None:
        return Peak(spec_tflops, "spec", gpu)
    advice = "set [job] gpu_peak_tflops in the spec"
    if not names:
        return Peak(None, gpu=gpu, missing=f"the nodes did not name their GPU model (no NVML there): {advice}")
    if len(names) > 1:
        return Peak(None, missing=f"the nodes' GPUs differ ({', '.join(repr(n) for n in names[:4])}): {advice}")
    tflops = table_peak(gpu)
    if tflops is None:
        return Peak(None, gpu=gpu, missing=f"clusterctl does not know the peak of {gpu!r}: {advice}")
    return Peak(tflops, "nvml", gpu)


@dataclass(frozen=True)
class Sample:
    """One node's counters at one moment of its own clock."""

    at: float
    tokens: float
    flops: float
    step: int
    step_at: float


@dataclass(frozen=True)
class NodeTrack:
    """One node's samples within the window (oldest first, plus the one before it), from one set of processes."""

    epoch: int
    taken_at: float
    """When the newest sample was taken (the agent's clock)."""
    samples: tuple[Sample, ...]
    latest: NodeMetrics


def _reset(before: Sample, after: Sample) -> bool:
    """Counters that went down: the node's ranks started counting again (a restart the epoch missed)."""
    return after.tokens < before.tokens or after.flops < before.flops or after.step < before.step


def _within(samples: tuple[Sample, ...], window: float) -> tuple[Sample, ...]:
    """The samples of the last `window` s (by the node's clock) and the one before them, none older than
    two windows (a node back from a long silence measures afresh, not across the silence)."""
    newest = samples[-1].at
    kept = [s for s in samples if s.at >= newest - 2 * window]
    inside = next((i for i, s in enumerate(kept) if s.at >= newest - window), len(kept) - 1)
    return tuple(kept[max(0, inside - 1):])


@dataclass(frozen=True)
class TrainingMeter:
    """Each node's recent training counters, carried from one summary to the next."""

    window: float = MIN_WINDOW_SECONDS
    tracks: Mapping[str, NodeTrack] = field(default_factory=dict)

    def observe(self, told: Iterable[tuple[str, NodeMetrics, float]]) -> TrainingMeter:
        """Take each node's newest metrics, with when the agent received them (its clock): a sample newer
        (by the node's clock) than the node's last is added; a new epoch or counters that went down start
        the node afresh."""
        tracks = dict(self.tracks)
        for node, metrics, heard_at in told:
            track = tracks.get(node)
            if track is not None and track.latest is metrics:
                continue  # the same report as at the last look
            sample = Sample(metrics.at, metrics.tokens, metrics.flops, metrics.step, metrics.step_at)
            if track is None or metrics.epoch != track.epoch or _reset(track.samples[-1], sample):
                tracks[node] = NodeTrack(metrics.epoch, heard_at, (sample,), metrics)
            elif sample.at > track.samples[-1].at:
                tracks[node] = NodeTrack(metrics.epoch, heard_at, _within((*track.samples, sample), self.window),
                                         metrics)
            else:  # nothing newer on the node's clock (a repeated heartbeat): only what it says now
                tracks[node] = replace(track, latest=metrics)
        return replace(self, tracks=tracks)

    def reading(self, at: float, gpus: int, peak: Peak) -> TrainingMetrics | None:
        """The job's figures at `at` (the agent's clock) over the nodes sampled within the window; None
        when no node has reported any metric.  `gpus`: the step's GPUs (MFU's denominator)."""
        if not self.tracks:
            return None
        tokens_rate = flops_rate = 0.0
        counted = reporting = 0
        step_rates: list[float] = []
        any_tokens = any_flops = False
        loss: NodeMetrics | None = None  # the lowest rank's that reported one, and its rank
        norm: NodeMetrics | None = None
        loss_rank = norm_rank = math.inf
        for track in self.tracks.values():
            latest = track.latest
            any_tokens = any_tokens or latest.tokens > 0
            any_flops = any_flops or latest.flops > 0
            if latest.loss_rank is not None and latest.loss_rank < loss_rank:
                loss, loss_rank = latest, latest.loss_rank
            if latest.grad_norm_rank is not None and latest.grad_norm_rank < norm_rank:
                norm, norm_rank = latest, latest.grad_norm_rank
            if at - track.taken_at > self.window:
                continue  # not heard (with anything new) for a whole window: a silent or wedged node
            reporting += 1
            first, last = track.samples[0], track.samples[-1]
            if last.at > first.at:
                seconds = last.at - first.at
                tokens_rate += (last.tokens - first.tokens) / seconds
                flops_rate += (last.flops - first.flops) / seconds
                counted += 1
            if last.step_at > first.step_at:
                step_rates.append((last.step - first.step) / (last.step_at - first.step_at))
        flops_per_s = flops_rate if any_flops and counted else None
        mfu = None
        if flops_per_s is not None and peak.tflops and gpus:
            mfu = flops_per_s / (gpus * peak.tflops * 1e12)
        return TrainingMetrics(
            window_s=self.window, nodes=counted, nodes_reporting=reporting, gpus=gpus,
            steps_per_s=statistics.median(step_rates) if step_rates else None,
            tokens_per_s=tokens_rate if any_tokens and counted else None, flops_per_s=flops_per_s, mfu=mfu,
            peak_tflops=peak.tflops, peak_from=peak.source, gpu=peak.gpu,
            mfu_missing=peak.missing if any_flops and peak.tflops is None else "",
            loss=loss.loss if loss else None, loss_step=loss.loss_step if loss else None,
            loss_rank=loss.loss_rank if loss else None, grad_norm=norm.grad_norm if norm else None,
            grad_norm_step=norm.grad_norm_step if norm else None, grad_norm_rank=norm.grad_norm_rank if norm else None)

    def gpu_names(self) -> set[str]:
        """The GPU models the nodes named."""
        return {track.latest.gpu for track in self.tracks.values() if track.latest.gpu}
