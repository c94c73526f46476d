"""What a node's GPUs say now: `healthd evidence --json`, read by the in-allocation agent.

The agent of a job runs it on a node whose ranks compute persistently slower than the job's (a
straggler, clusterctl.launcher.pure.straggler_watch) as a one-off step (`--job-gpus`: only the GPUs
the job has on that node), and reads the record from its stdout: which GPUs were read and why
(`scope`), per GPU the NVML clocks-event reasons, the SM clock against its maximum, the temperature,
the ECC counters, a pending row remap and healthd's current findings.  `slowdown_reasons` says, in
sentences, what of that explains a slowdown; the agent drains the node only when something does.

Version 2 added `scope`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from clusterctl.records.versioned import RecordError, check_header, field, header, number_field, strings_field

KIND = "gpu-evidence"
VERSION = 2

# nvmlClocksEventReason* (nvml.h): the bit, and how NVIDIA names it.
CLOCK_REASONS = (
    (0x1, "GPU idle"),
    (0x2, "applications clocks setting"),
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake slowdown"),
    (0x100, "display clock setting"),
    (0x200, "board limit"),
    (0x400, "reliability"),
)
SLOWDOWN_REASONS = 0x8 | 0x20 | 0x40 | 0x80
"""The reasons that mean the hardware slowed the GPU down against the workload's wish."""
LOW_CLOCK_FRACTION = 0.9
"""An SM clock below this share of its maximum with no reason given still counts as slowed."""
SLOWDOWN_FINDINGS = ("clock-events", "thermal", "thermal-sustained")
"""healthd findings (kinds, healthd/policy.py) that explain a slowdown on their own: clock events held
for minutes, a temperature over the warning limit."""

_OPTIONAL_INT = (int, type(None))


def clock_reason_names(mask: int) -> tuple[str, ...]:
    """NVIDIA's names of the clocks-event reasons set in `mask` (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"unknown {hex(mask & ~known)}")
    return tuple(names)


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML and healthd see it now."""

    index: int
    uuid: str = ""
    clock_event_reasons: int = 0
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    remapped_pending: bool = False
    """A row remap waits for the next GPU reset (shown; it does not slow compute by itself)."""
    findings: tuple[str, ...] = ()
    """healthd's current findings on this GPU, `<kind>: <reason> (<action>)`."""

    @property
    def clock_fraction(self) -> float | None:
        """The SM clock as a share of its maximum, when both are known."""
        if self.sm_clock_mhz is None or not self.sm_clock_max_mhz:
            return None
        return self.sm_clock_mhz / self.sm_clock_max_mhz

    def clock_text(self) -> str:
        """`792/1980 MHz (40%)`, `792 MHz (maximum unknown)` or `unknown`."""
        fraction = self.clock_fraction
        if fraction is not None:
            return f"{self.sm_clock_mhz}/{self.sm_clock_max_mhz} MHz ({fraction:.0%})"
        if self.sm_clock_mhz is not None:
            return f"{self.sm_clock_mhz} MHz (maximum unknown)"
        return "unknown"

    def slowdown(self) -> str:
        """One sentence on what slows this GPU down, or "" when nothing does."""
        clauses = []
        slow = self.clock_event_reasons & SLOWDOWN_REASONS
        if slow:
            clauses.append(f"clock event reasons {', '.join(clock_reason_names(slow))} ({hex(self.clock_event_reasons)})")
            if self.sm_clock_mhz is not None:
                clauses.append(f"SM clock {self.clock_text()}")
        else:
            fraction = self.clock_fraction
            # Only with no reason at all: idle, a power cap or application clocks lower the clock by
            # design (a busy GPU often runs a little under its maximum at its power cap).
            if fraction is not None and fraction < LOW_CLOCK_FRACTION and self.clock_event_reasons == 0:
                clauses.append(f"SM clock {self.clock_text()} with no reason given")
        clauses += [f"healthd: {f}" for f in self.findings if f.split(":", 1)[0] in SLOWDOWN_FINDINGS]
        if not clauses:
            return ""
        if self.temperature_c is not None:
            clauses.append(f"{self.temperature_c} °C")
        return f"GPU {self.index}: " + "; ".join(clauses)

    def to_json(self) -> dict[str, Any]:
        """As stored (`clock_reasons` spelled out for people and jq)."""
        return {"index": self.index, "uuid": self.uuid, "clock_event_reasons": self.clock_event_reasons,
                "clock_reasons": list(clock_reason_names(self.clock_event_reasons)),
                "sm_clock_mhz": self.sm_clock_mhz, "sm_clock_max_mhz": self.sm_clock_max_mhz,
                "temperature_c": self.temperature_c, "ecc_corrected_volatile": self.ecc_corrected_volatile,
                "ecc_uncorrected_volatile": self.ecc_uncorrected_volatile, "remapped_pending": self.remapped_pending,
                "findings": list(self.findings)}

    @classmethod
    def from_json(cls, data: object, where: str) -> GpuReading:
        """Parse one GPU's reading; RecordError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise RecordError(where, "a GPU reading is not a JSON object")
        return cls(index=field(data, "index", int, where), uuid=field(data, "uuid", str, where),
                   clock_event_reasons=field(data, "clock_event_reasons", int, where),
                   sm_clock_mhz=field(data, "sm_clock_mhz", _OPTIONAL_INT, where),
                   sm_clock_max_mhz=field(data, "sm_clock_max_mhz", _OPTIONAL_INT, where),
                   temperature_c=field(data, "temperature_c", _OPTIONAL_INT, where),
                   ecc_corrected_volatile=field(data, "ecc_corrected_volatile", int, where),
                   ecc_uncorrected_volatile=field(data, "ecc_uncorrected_volatile", int, where),
                   remapped_pending=field(data, "remapped_pending", bool, where),
                   findings=strings_field(data, "findings", where))


@dataclass(frozen=True)
class GpuEvidence:
    """A node's GPUs at `at` (epoch s), which of them were asked and why (`scope`), and what could not
    be read (`problems`)."""

    node: str
    at: float
    gpus: tuple[GpuReading, ...] = ()
    problems: tuple[str, ...] = ()
    scope: str = ""
    """Which GPUs were read and why, e.g. `GPU 4,5,6,7: this job's on this node (SLURM_STEP_GPUS)`,
    `every GPU of the node`, `no GPU: SLURM_STEP_GPUS is not set (...)`; empty only in a record built by
    hand."""

    def slowdown_reasons(self, gpus: Collection[int] | None = None) -> tuple[str, ...]:
        """One sentence per GPU (of `gpus`, or all) whose hardware says it is slowed; empty: nothing
        here explains a slowdown."""
        return tuple(line for g in self.gpus if gpus is None or g.index in gpus if (line := g.slowdown()))

    def to_text(self) -> list[str]:
        """Lines for a person: one per GPU (and its healthd findings), what explains a slowdown, the problems."""
        lines = [f"{self.node}: {len(self.gpus)} GPUs" + (f" read ({self.scope})" if self.scope else "")]
        for g in self.gpus:
            reasons = ", ".join(clock_reason_names(g.clock_event_reasons)) or "none"
            temp = f"{g.temperature_c} °C" if g.temperature_c is not None else "temperature unknown"
            remap = "; row remap pending" if g.remapped_pending else ""
            lines.append(f"GPU {g.index} {g.uuid}: SM clock {g.clock_text()}; clock event reasons {reasons} "
                         f"({hex(g.clock_event_reasons)}); {temp}; ECC volatile corrected {g.ecc_corrected_volatile}, "
                         f"uncorrected {g.ecc_uncorrected_volatile}{remap}")
            lines += [f"    healthd: {f}" for f in g.findings]
        slow = self.slowdown_reasons()
        lines.append("slowed: " + ("; ".join(slow) if slow else "nothing here explains a slowdown"))
        lines += [f"problem: {p}" for p in self.problems]
        return lines

    def to_json(self) -> dict[str, Any]:
        """The record as printed."""
        return {**header(KIND, VERSION), "node": self.node, "at": self.at, "gpus": [g.to_json() for g in self.gpus],
                "problems": list(self.problems), "scope": self.scope}

    @classmethod
    def from_json(cls, data: object, where: str) -> GpuEvidence:
        """Parse a record; RecordError for anything not understood (a newer version included)."""
        body = check_header(data, KIND, VERSION, where)
        return cls(node=field(body, "node", str, where), at=number_field(body, "at", where),
                   gpus=tuple(GpuReading.from_json(g, f"{where}: gpus[{i}]")
                              for i, g in enumerate(field(body, "gpus", list, where))),
                   problems=strings_field(body, "problems", where), scope=field(body, "scope", str, where))
