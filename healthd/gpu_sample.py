"""One read of a GPU's health counters: what healthd/nvml.py fills and healthd/checks/ judges.

Its own module, free of pynvml, so that what only judges (the checks, the policy, the config, the prolog,
epilog and HealthCheckProgram that load them) never loads the NVML bindings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSample:
    """One read of a GPU's health counters through NVML (`Nvml.sample`); healthd/checks/ judges it."""

    index: int
    uuid: str = ""
    lost: bool = False
    ecc_volatile_dbe: int = 0
    ecc_volatile_sbe: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pages_sbe: int = 0
    retired_pages_dbe: int = 0
    retired_pending: bool = False
    temperature_c: int | None = None
    clock_event_reasons: int = 0
    nvlink_down: tuple[int, ...] = ()
    recovery_action: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    nvlink_errors: tuple[tuple[int, int, int, int], ...] = ()
    """(link, replay, recovery, CRC flit) error counters of each active NVLink link."""
