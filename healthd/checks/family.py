"""What a check family declares: its finding kinds and its policy rows (its limits are its own dataclass).

`clusterctl.healthd.checks` gathers every family: the periodic checks run their judgements, healthd's
policy gathers their rows, healthd.toml's [checks] table reads their limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clusterctl.healthd.findings import Action, Finding, FindingKind

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class Condition:
    """One policy row: a finding of `kind` calls for `action` because of `meaning`.

    `shown_before` keeps `healthd policy`'s table in the order it has always had, where a family's
    row was added between another family's rows.  `evidence_in_reason`: a drain over such a finding carries
    the finding's detail in Slurm's reason (the device, port, counter, rate and threshold an admin acts on).
    """

    kind: FindingKind
    action: Action
    meaning: str
    shown_before: str = ""
    evidence_in_reason: bool = False


GpuJudgement = Callable[["GpuSample", Any, "Sustained", float], list[Finding]]
"""(sample, limits, sustained, now) → findings of one GPU sample; `limits` is `CheckLimits`."""


@dataclass(frozen=True)
class CheckFamily:
    """One family of checks: the kinds it finds, its policy rows, and its judgement of a GPU sample (if any)."""

    name: str
    kinds: tuple[FindingKind, ...]
    conditions: tuple[Condition, ...] = ()
    check_gpu: GpuJudgement | None = None


def limit(default: int | float, low: float, high: float) -> Any:
    """A [checks] limit: its default and the range healthd.toml may set it to (inclusive)."""
    return field(default=default, metadata={"range": (low, high)})


def gpu_finding(sample: GpuSample, now: float, kind: FindingKind, value: object = None, detail: str = "") -> Finding:
    """A periodic finding about the GPU of `sample`."""
    return Finding(kind, "periodic", now, gpu=sample.index, uuid=sample.uuid, value=value, detail=detail)  # type: ignore[arg-type]
