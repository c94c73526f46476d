"""InfiniBand/RoCE ports from sysfs: a port down, a port below its expected rate, error counters climbing.

What it reads (the kernel's layout, under a configurable root so tests and the testbed give each node
its own tree): `<root>/sys/class/infiniband/<dev>/ports/<n>/state` ("4: ACTIVE"), `phys_state`
("5: LinkUp"), `rate` ("200 Gb/sec (4X HDR)") and `counters/<name>`; the NIC's PCIe link from
`<root>/sys/class/infiniband/<dev>/device/{current,max}_link_{width,speed}` (judged by checks/pcie.py).

Error counters are judged by their rate per minute (checks/counter_rate.py: resets and wraps never
count).  The defaults are infiniband-diags' `ibcheckerrs` thresholds (10 symbol errors, 10 receive
errors, 10 link error recoveries, 10 link-downs) read as "per minute": a healthy HDR/NDR link shows
none in a minute, a failing cable or transceiver shows them every minute.  A link that went down and
came back (link_downed) even once a minute is a flapping port: the job's collectives stall on it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.healthd.checks.counter_rate import CounterRates
from clusterctl.healthd.checks.family import CheckFamily, Condition, limit
from clusterctl.healthd.findings import Action, Finding, FindingKind

SYSFS_IB = "sys/class/infiniband"

FLAP_COUNTERS = ("link_downed", "link_error_recovery")
"""Counters that say the link went down or retrained: "ib-link-flap"."""
ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors")
"""Counters that say bits or packets arrive damaged: "ib-errors"."""


@dataclass(frozen=True)
class IbPort:
    """One port of an InfiniBand/RoCE device as sysfs shows it."""

    device: str  # "mlx5_0"
    port: int
    state: str = ""  # "ACTIVE", "DOWN", "INIT", ... (the name after "4: ")
    phys_state: str = ""  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None = None
    counters: tuple[tuple[str, int], ...] = ()

    @property
    def name(self) -> str:
        """`mlx5_0/1`: how findings and drain reasons name the port."""
        return f"{self.device}/{self.port}"


@dataclass(frozen=True)
class PcieLink:
    """A PCIe device's link (a NIC from sysfs, a GPU from NVML): current and maximum width and speed.

    Speed is the generation for a GPU (NVML) and GT/s for a NIC (sysfs); None when it cannot be read."""

    device: str
    width: int | None = None
    width_max: int | None = None
    speed: float | None = None
    speed_max: float | None = None


@dataclass(frozen=True)
class NicSample:
    """Every IB/RoCE port of the node and the PCIe link of each device."""

    ports: tuple[IbPort, ...] = ()
    links: tuple[PcieLink, ...] = ()


@dataclass(frozen=True)
class NetworkLimits:
    """[checks] limits of this family (rates per minute; see the module's docstring for why these)."""

    ib_expected_rate_gbps: float = limit(0, 0.0, 10_000.0)
    """0: each port's highest rate seen since healthd started."""
    ib_symbol_error_per_min: float = limit(10, 0.0, 1e9)
    ib_rcv_errors_per_min: float = limit(10, 0.0, 1e9)
    ib_link_downed_per_min: float = limit(0.5, 0.0, 1e9)
    ib_link_recovery_per_min: float = limit(5, 0.0, 1e9)
    counter_window_s: float = limit(60, 10.0, 3600.0)
    """Error-counter rates are taken over the reads of about this many seconds (at least half of it)."""


def _limit_of(counter: str, limits: NetworkLimits) -> float:
    return {"symbol_error": limits.ib_symbol_error_per_min, "link_downed": limits.ib_link_downed_per_min,
            "link_error_recovery": limits.ib_link_recovery_per_min}.get(counter, limits.ib_rcv_errors_per_min)


@dataclass
class NetworkMemory:
    """What the network checks remember between passes: counter reads and each port's best rate."""

    rates: CounterRates = field(default_factory=CounterRates)
    best_rate: dict[str, float] = field(default_factory=dict)


def check_network(sample: NicSample, limits: NetworkLimits, memory: NetworkMemory, now: float) -> list[Finding]:
    """Findings about every port of `sample` (a down port says nothing else)."""
    if memory.rates.window != limits.counter_window_s:
        memory.rates = CounterRates(limits.counter_window_s, limits.counter_window_s / 2)
    out: list[Finding] = []
    seen: set[str] = set()
    for port in sample.ports:
        if port.state != "ACTIVE" or port.phys_state != "LinkUp":
            out.append(_finding("ib-port-down", port, now, f"{port.name} state {port.state or '?'} "
                                                           f"phys_state {port.phys_state or '?'}"))
            continue
        if port.rate_gbps is not None:
            best = max(memory.best_rate.get(port.name, 0.0), port.rate_gbps)
            memory.best_rate[port.name] = best
            expected = limits.ib_expected_rate_gbps or best
            if port.rate_gbps < expected:
                out.append(_finding("ib-port-slow", port, now, f"{port.name} rate {port.rate_gbps:g} Gb/s "
                                                               f"< expected {expected:g} Gb/s"))
        for counter, value in port.counters:
            if counter not in FLAP_COUNTERS and counter not in ERROR_COUNTERS:
                continue
            key = f"{port.name}:{counter}"
            seen.add(key)
            rate = memory.rates.per_minute(key, value, now)
            threshold = _limit_of(counter, limits)
            if rate is not None and rate > threshold:
                kind: FindingKind = "ib-link-flap" if counter in FLAP_COUNTERS else "ib-errors"
                out.append(_finding(kind, port, now, f"{port.name} {counter} {rate:.1f}/min > {threshold:g}/min"))
    memory.rates.forget(seen)
    return out


def _finding(kind: FindingKind, port: IbPort, now: float, detail: str) -> Finding:
    return Finding(kind, "network", now, value=port.name, detail=detail)


# ---- reading sysfs (the one impure part: files under `root`) --------------------------------------
# Plain os calls on str paths: a pass reads about a hundred small files, and pathlib's objects cost
# several times the read itself (8 ports: 4.8 ms CPU a pass with pathlib, 0.9 ms like this).

_LEADING_NUMBER = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)")


def _text(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        return os.read(fd, 256).decode(errors="replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _number(text: str) -> float | None:
    match = _LEADING_NUMBER.match(text)
    return float(match.group(1)) if match else None


def _state_name(text: str) -> str:
    """`4: ACTIVE` → `ACTIVE` (older kernels write the name alone)."""
    return text.split(":", 1)[1].strip() if ":" in text else text


def read_port(device: str, port_dir: str, port: int) -> IbPort:
    """One port's state, rate and counters (a counter that cannot be read is left out)."""
    counters = []
    for name in (*FLAP_COUNTERS, *ERROR_COUNTERS):
        value = _number(_text(f"{port_dir}/counters/{name}"))
        if value is not None:
            counters.append((name, int(value)))
    return IbPort(device, port, _state_name(_text(f"{port_dir}/state")), _state_name(_text(f"{port_dir}/phys_state")),
                  _number(_text(f"{port_dir}/rate")), tuple(counters))


def read_pcie_link(name: str, device_dir: str) -> PcieLink | None:
    """A PCI device's link from its sysfs directory; None when it shows none (a virtual device)."""
    width, width_max = _number(_text(f"{device_dir}/current_link_width")), _number(_text(f"{device_dir}/max_link_width"))
    if width is None and width_max is None:
        return None
    return PcieLink(name, None if width is None else int(width), None if width_max is None else int(width_max),
                    _number(_text(f"{device_dir}/current_link_speed")), _number(_text(f"{device_dir}/max_link_speed")))


def read_nics(root: Path, devices: Collection[str] = ()) -> NicSample:
    """Every port of every IB/RoCE device under `root` (only `devices` when given) and each device's PCIe link.

    No /sys/class/infiniband (a node without such NICs) is an empty sample, not an error."""
    base = f"{root}/{SYSFS_IB}"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return NicSample()
    ports: list[IbPort] = []
    links: list[PcieLink] = []
    for name in names:
        if devices and name not in devices:
            continue
        try:
            numbers = sorted(int(entry) for entry in os.listdir(f"{base}/{name}/ports") if entry.isdigit())
        except OSError:
            numbers = []
        ports += [read_port(name, f"{base}/{name}/ports/{number}", number) for number in numbers]
        link = read_pcie_link(name, f"{base}/{name}/device")
        if link is not None:
            links.append(link)
    return NicSample(tuple(ports), tuple(links))


_ROWS: tuple[tuple[FindingKind, str], ...] = (
    ("ib-port-down", "an InfiniBand/RoCE port is not ACTIVE/LinkUp"),
    ("ib-port-slow", "an InfiniBand/RoCE port runs below its expected rate"),
    ("ib-errors", "a port's error counters climb faster than allowed (cable, optics)"),
    ("ib-link-flap", "a port's link goes down or retrains faster than allowed"),
)
FAMILY = CheckFamily("network", tuple(kind for kind, _ in _ROWS), tuple(
    Condition(kind, Action.DRAIN_RESET, meaning, evidence_in_reason=True) for kind, meaning in _ROWS))
