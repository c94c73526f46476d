"""PCIe links running below their maximum: a GPU's (NVML) or a NIC's (sysfs, read by checks/network.py).

A link that trained at x8 instead of x16, or at a lower generation, halves the device's bandwidth to
the host: checkpoint copies and GPUDirect RDMA crawl on that node and the whole job waits for it.  It
rarely fixes itself: a reboot retrains the link, a reseat or an RMA fixes what a reboot does not.

A GPU's *generation* drops by design while it is idle (the driver saves power on the link), so only
its width is judged unless `pcie_gpu_generation = 1`; a NIC's link does not idle down: its width and
speed are both judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterctl.healthd.checks.family import CheckFamily, Condition, gpu_finding, limit
from clusterctl.healthd.checks.network import PcieLink
from clusterctl.healthd.findings import Action, Finding

if TYPE_CHECKING:
    from clusterctl.healthd.checks.sustained import Sustained
    from clusterctl.healthd.gpu_sample import GpuSample


@dataclass(frozen=True)
class PcieLimits:
    """[checks] limits of this family."""

    pcie_gpu_generation: int = limit(0, 0, 1)
    """1: a GPU whose link generation is below its maximum is degraded too (false alarms on idle GPUs)."""


def _below(link: PcieLink, speed_too: bool) -> str:
    """What is below maximum, as an admin reads it (empty: nothing)."""
    parts = []
    if link.width is not None and link.width_max is not None and link.width < link.width_max:
        parts.append(f"width x{link.width} < x{link.width_max}")
    if speed_too and link.speed is not None and link.speed_max is not None and link.speed < link.speed_max:
        parts.append(f"speed {link.speed:g} < {link.speed_max:g}")
    return ", ".join(parts)


def check_gpu(sample: GpuSample, limits: Any, sustained: Sustained, now: float) -> list[Finding]:
    """A GPU's PCIe link below its maximum width (and generation, when asked)."""
    link = PcieLink(f"gpu{sample.index}", sample.pcie_width, sample.pcie_width_max, sample.pcie_gen,
                    sample.pcie_gen_max)
    below = _below(link, bool(limits.pcie_gpu_generation)).replace("speed", "gen")
    return [gpu_finding(sample, now, "pcie-degraded", link.device, f"gpu{sample.index} PCIe {below}")] if below else []


def check_nic_links(links: Sequence[PcieLink], now: float) -> list[Finding]:
    """Each NIC whose PCIe link is below its maximum width or speed (GT/s)."""
    return [Finding("pcie-degraded", "network", now, value=link.device, detail=f"{link.device} PCIe {below}")
            for link in links if (below := _below(link, True))]


FAMILY = CheckFamily("pcie", ("pcie-degraded",), (
    Condition("pcie-degraded", Action.DRAIN_REBOOT, "a GPU's or NIC's PCIe link runs below its maximum width "
                                                    "or speed (a reboot retrains it; reseat if it stays)", evidence_in_reason=True),
), check_gpu)
