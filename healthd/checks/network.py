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

RoCE ports (`ports/<n>/link_layer` "Ethernet") carry the same state and rate files, but their IB error
counters under `counters/` read zero or are absent: the link's health is in Ethernet's counters and the
transport's in the RDMA driver's `ports/<n>/hw_counters/`.  Names and meanings are the mlx5 driver's
(Linux `drivers/infiniband/hw/mlx5/counters.c`; descriptions from the commits that added them:
0ad17a8f "IB/mlx5: Add port protocol stats", 58dcb60a "extended error counters", d7fab916 "RoCE
accelerator counters", "RDMA/mlx5: Add Qcounters req_transport_retries_exceeded/req_rnr_retries_exceeded"
(2024); RDMA_HW_STATS_DEFAULT_LIFESPAN in include/rdma/ib_verbs.h; NVIDIA WinOF-2 "RDMA Capabilities" on
retransmissions from Local Ack Timeout, NAK-Sequence Error and Implied NAK).  Each is judged by what it
can prove about *this* node, conservatively: a healthy node is never drained.

- Drain (`ib-errors`, drain-reset): Ethernet FCS errors on frames arriving at this port, the port's
  netdev's `statistics/rx_crc_errors` (`<root>/sys/class/net/<if>/...`, the netdev named by the port's
  `gid_attrs/ndevs/0`; the standard netdev statistic, which mlx5e fills from the port's IEEE 802.3
  frame-check-sequence errors).  A frame damaged
  on the one cable into this NIC: this cable, this optic, this NIC (or the switch port facing it), the
  very evidence `symbol_error`/`port_rcv_errors` give on InfiniBand, at the same 10 a minute.
- Warn (`roce-retransmits`), never drained: the transport's loss and retransmission counters
  `local_ack_timeout_err` (this requester's ACK timer expired: a multi-second stall of the queue pair),
  `packet_seq_err` (NAK-sequence errors received: the peer saw a gap), `implied_nak_seq_err` (an ACK
  for a later packet than expected: one was lost), `out_of_sequence` (packets received out of order),
  and `rx_icrc_encapsulated` (RoCE packets dropped with a bad invariant CRC).  They count the *path*:
  this NIC, the switches, the peer.  One peer that dies makes every node that talks to it time out at
  once; a congested spine or a lossy (non-PFC) fabric makes many nodes lose packets together;
  adaptive routing delivers out of order by design; a bad ICRC behind a good FCS was damaged before
  the last hop (a switch, the sender).  Draining on them would take out healthy nodes by the rack, so
  they tell the admin (the counter, its rate, the threshold) and the job keeps its node.  Defaults:
  60 sequence errors a minute (one a second, sustained; a lossless fabric shows none), 2 ACK timeouts
  a minute (each is NCCL_IB_TIMEOUT, ~4 s at NCCL's default 20, of a stalled connection), 10 ICRC
  drops a minute.
- Never judged, never read: the congestion counters (`np_cnp_sent`, `np_ecn_marked_roce_packets`,
  `rp_cnp_handled`, `rp_cnp_ignored`) are DCQCN doing its job on a busy fabric: a healthy node at full
  bandwidth shows thousands a second.  Nor the counters of what the job's software did:
  `out_of_buffer` and `rnr_nak_retry_err` (a receive not posted in time), `resp_local_length_error`
  (a buffer too small), `req_cqe_error`/`resp_cqe_error` and the `*_cqe_flush_error`s (a queue pair torn
  down with work posted, as every job does at exit), `*_remote_access_errors`/`*_remote_invalid_request`
  (a wrong key or opcode), `duplicate_request` (the peer's own timeouts, seen from this side).
  `req_transport_retries_exceeded` (a queue pair that gave up) is the job's own error report, and like
  the timeouts it follows a dead peer: not judged either.

mlx5's queue-pair counters are 32 bits wide and wrap: counter_rate.py takes a wrap for a reset.  Each
read of a `hw_counters` file may ask the NIC's firmware (the driver caches the answer for
`hw_counters/lifespan`, 10 ms): a pass reads only the five judged ones, back to back, within one answer.
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
SYSFS_NET = "sys/class/net"

FLAP_COUNTERS = ("link_downed", "link_error_recovery")
"""Counters that say the link went down or retrained: "ib-link-flap"."""
ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors")
"""Counters that say bits or packets arrive damaged: "ib-errors"."""
ROCE_LINK_COUNTERS = ("rx_crc_errors",)
"""A RoCE port's netdev statistics that say frames arrive damaged: "ib-errors" too."""
ROCE_RETRANSMIT_COUNTERS = ("local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "out_of_sequence",
                            "rx_icrc_encapsulated")
"""A RoCE port's `hw_counters` that say packets were lost on the path: "roce-retransmits" (a warning)."""
ETHERNET = "Ethernet"


@dataclass(frozen=True)
class IbPort:
    """One port of an InfiniBand/RoCE device as sysfs shows it."""

    device: str  # "mlx5_0"
    port: int
    state: str = ""  # "ACTIVE", "DOWN", "INIT", ... (the name after "4: ")
    phys_state: str = ""  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None = None
    counters: tuple[tuple[str, int], ...] = ()
    """IB error counters; on a RoCE port its netdev's `rx_crc_errors` and the judged `hw_counters`."""
    link_layer: str = ""  # "InfiniBand", "Ethernet" (RoCE); "" when not shown

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
    roce_fcs_errors_per_min: float = limit(10, 0.0, 1e9)
    """A RoCE port's netdev `rx_crc_errors`: drains, like `ib_rcv_errors_per_min`."""
    roce_seq_errors_per_min: float = limit(60, 0.0, 1e9)
    """`packet_seq_err`, `implied_nak_seq_err`, `out_of_sequence`: warns only."""
    roce_ack_timeout_per_min: float = limit(2, 0.0, 1e9)
    """`local_ack_timeout_err`: warns only."""
    roce_icrc_errors_per_min: float = limit(10, 0.0, 1e9)
    """`rx_icrc_encapsulated`: warns only."""


def _limit_of(counter: str, limits: NetworkLimits) -> float:
    return {"symbol_error": limits.ib_symbol_error_per_min, "link_downed": limits.ib_link_downed_per_min,
            "link_error_recovery": limits.ib_link_recovery_per_min, "rx_crc_errors": limits.roce_fcs_errors_per_min,
            "local_ack_timeout_err": limits.roce_ack_timeout_per_min,
            "rx_icrc_encapsulated": limits.roce_icrc_errors_per_min, "packet_seq_err": limits.roce_seq_errors_per_min,
            "implied_nak_seq_err": limits.roce_seq_errors_per_min, "out_of_sequence": limits.roce_seq_errors_per_min,
            }.get(counter, limits.ib_rcv_errors_per_min)


def _kind_of(counter: str) -> FindingKind | None:
    """The finding a counter over its limit makes; None for a counter this check does not judge."""
    if counter in FLAP_COUNTERS:
        return "ib-link-flap"
    if counter in ERROR_COUNTERS or counter in ROCE_LINK_COUNTERS:
        return "ib-errors"
    if counter in ROCE_RETRANSMIT_COUNTERS:
        return "roce-retransmits"
    return None


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
            kind = _kind_of(counter)
            if kind is None:
                continue
            key = f"{port.name}:{counter}"
            seen.add(key)
            rate = memory.rates.per_minute(key, value, now)
            threshold = _limit_of(counter, limits)
            if rate is not None and rate > threshold:
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


def _read_counters(directory: str, names: tuple[str, ...], into: list[tuple[str, int]]) -> None:
    for name in names:
        value = _number(_text(f"{directory}/{name}"))
        if value is not None:
            into.append((name, int(value)))


def read_port(device: str, port_dir: str, port: int, root: str = "") -> IbPort:
    """One port's state, rate and counters (a counter that cannot be read is left out).

    A RoCE port (link_layer "Ethernet") also gives its judged `hw_counters` and the `rx_crc_errors` of
    its netdev (`gid_attrs/ndevs/0` names it; read under `root`/sys/class/net)."""
    counters: list[tuple[str, int]] = []
    _read_counters(f"{port_dir}/counters", (*FLAP_COUNTERS, *ERROR_COUNTERS), counters)
    link_layer = _text(f"{port_dir}/link_layer")
    if link_layer == ETHERNET:
        _read_counters(f"{port_dir}/hw_counters", ROCE_RETRANSMIT_COUNTERS, counters)
        netdev = _text(f"{port_dir}/gid_attrs/ndevs/0")
        if netdev and "/" not in netdev and not netdev.startswith("."):
            _read_counters(f"{root}/{SYSFS_NET}/{netdev}/statistics", ROCE_LINK_COUNTERS, counters)
    return IbPort(device, port, _state_name(_text(f"{port_dir}/state")), _state_name(_text(f"{port_dir}/phys_state")),
                  _number(_text(f"{port_dir}/rate")), tuple(counters), link_layer)


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
        ports += [read_port(name, f"{base}/{name}/ports/{number}", number, str(root)) for number in numbers]
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
_WARN_ROWS: tuple[tuple[FindingKind, str], ...] = (
    ("roce-retransmits", "a RoCE port's transport loses packets faster than allowed (the path, not proof of "
                         "this node: warn only)"),
)
FAMILY = CheckFamily("network", tuple(kind for kind, _ in (*_ROWS, *_WARN_ROWS)), (
    *(Condition(kind, Action.DRAIN_RESET, meaning, evidence_in_reason=True) for kind, meaning in _ROWS),
    *(Condition(kind, Action.WARN, meaning, evidence_in_reason=True) for kind, meaning in _WARN_ROWS)))
