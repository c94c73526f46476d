"""NVLink links that are inactive, and links whose error counters (CRC, replay, recovery) climb too fast.

The counters are judged by their rate per minute (checks/counter_rate.py), never by their total: a
healthy link shows none; a few CRC errors followed by replays are what a marginal link does before it
drops, and every replay or recovery stalls the collectives that cross it.  Defaults: 60 CRC flit
errors or 60 replays a minute (one a second, sustained), or one recovery (a retrain of the link, tens
of milliseconds with no traffic) a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class NvlinkLimits:
    """[checks] limits of this family (per minute)."""

    nvlink_crc_per_min: float = limit(60, 0.0, 1e9)
    nvlink_replay_per_min: float = limit(60, 0.0, 1e9)
    nvlink_recovery_per_min: float = limit(1, 0.0, 1e9)


def check(sample: GpuSample, limits: Any, sustained: Sustained, now: float) -> list[Finding]:
    """Any inactive link drains: the job's collectives would crawl over the fallback path.  Each active
    link's error counters over their rate limits drain too."""
    out = []
    if sample.nvlink_down:
        links = ",".join(map(str, sample.nvlink_down))
        out.append(gpu_finding(sample, now, "nvlink-down", links, f"links {links} inactive"))
    for link, *counters in sample.nvlink_errors:
        for name, value, threshold in zip(("replay", "recovery", "crc"), counters,
                                          (limits.nvlink_replay_per_min, limits.nvlink_recovery_per_min,
                                           limits.nvlink_crc_per_min)):
            rate = sustained.rates.per_minute(f"nvlink:{sample.uuid or sample.index}:{link}:{name}", value, now)
            if rate is not None and rate > threshold:
                out.append(gpu_finding(sample, now, "nvlink-errors", f"link{link}",
                                       f"gpu{sample.index} nvlink {link} {name} {rate:.1f}/min > {threshold:g}/min"))
    return out


FAMILY = CheckFamily("nvlink", ("nvlink-down", "nvlink-errors"), (
    Condition("nvlink-down", Action.DRAIN_RESET, "an NVLink link is inactive"),
    Condition("nvlink-errors", Action.DRAIN_RESET, "an NVLink link's CRC/replay/recovery errors climb faster "
                                                   "than allowed", evidence_in_reason=True),
), check)
