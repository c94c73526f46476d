"""Is a node of the step gone?  Two independent witnesses, neither of them Slurm.

Slurm notices a node that died without a word (power, kernel panic, a cut link) only after
SlurmdTimeout: 300 s by default, often more (shared/notes/production-timeouts.md).  The job has
its own evidence much sooner:

1. a **suspicion**: the node's neighbours have not heard its reporter beat for PEER_SILENT_SECONDS
   (launcher/pure/peer_watch.py), or the agent itself has not heard its reports for `silent_after`;
2. the agent's own **probe** of the node: a TCP connection to its slurmd port, answered by the node's
   kernel (accepted, or refused: either way the node is up) or not (no answer within the probe's
   timeout, or the network says the host is unreachable).

A node is blamed only when it is suspected and the agent's last PROBES_TO_BLAME probes of it,
PROBE_GAP_SECONDS apart, all went unanswered: a node whose reporter died, or that is loaded to
100% CPU, still answers (its kernel accepts connections), and a lost datagram or two never makes a
suspicion.  A probe the agent could not make (the node's name does not resolve on the agent's
node) counts for nothing either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from clusterctl.launcher.pure.classify import Blame

PROBES_TO_BLAME = 2
"""Unanswered probes in a row, the last of them while the node is suspected, before it is blamed."""
PROBE_GAP_SECONDS = 0.25
"""Seconds between the end of one probe of a suspected node and the start of the next."""
PROBE_TIMEOUT_SECONDS = 0.5
"""How long a probe waits for the node's kernel to answer: a node on the job's network answers in well
under a millisecond, loaded or not.  A lost SYN or answer is sent again only after Linux's 1 s, past
any timeout short enough to matter, so a probe is unanswered in about 2% of tries at 1% loss (measured:
bench/peer_watch_bench.py) whatever this is; two in a row are needed to blame."""
UNREACHABLE = "unreachable: its neighbours and the agent lost it"


@dataclass(frozen=True)
class ProbeResult:
    """One probe of `node` that ended at `at` (the agent's monotonic clock)."""

    node: str
    at: float
    answered: bool | None
    """True: the node's kernel answered; False: no answer (timeout, host unreachable); None: not made."""
    detail: str


@dataclass(frozen=True)
class Probes:
    """The probes of each node so far: unanswered ones in a row, the newest result, the newest end."""

    unanswered: Mapping[str, int] = field(default_factory=dict)
    last: Mapping[str, ProbeResult] = field(default_factory=dict)

    def took(self, result: ProbeResult) -> Probes:
        """`result` came in."""
        unanswered = dict(self.unanswered)
        if result.answered is True:
            unanswered.pop(result.node, None)
        elif result.answered is False:
            unanswered[result.node] = unanswered.get(result.node, 0) + 1
        return replace(self, unanswered=unanswered, last={**self.last, result.node: result})

    def due(self, node: str, at: float) -> bool:
        """Whether a suspected `node` is to be probed at `at` (never probed, or PROBE_GAP_SECONDS after the last)."""
        last = self.last.get(node)
        return last is None or at - last.at >= PROBE_GAP_SECONDS

    def forget(self, keep: set[str]) -> Probes:
        """Only the nodes in `keep` (still suspected) keep their count: a suspicion that ended starts again at 0."""
        if set(self.last) <= keep:
            return self
        return Probes({n: c for n, c in self.unanswered.items() if n in keep},
                      {n: r for n, r in self.last.items() if n in keep})


def unreachable(suspected: Mapping[str, str], probes: Probes) -> list[Blame]:
    """The suspected nodes (node -> why suspected) whose last PROBES_TO_BLAME probes went unanswered."""
    blames = []
    for node, why in sorted(suspected.items()):
        count = probes.unanswered.get(node, 0)
        if count >= PROBES_TO_BLAME:
            detail = probes.last[node].detail
            blames.append(Blame(node, UNREACHABLE, (
                f"{node}: {why}",
                f"{node}: the agent's last {count} probes of it went unanswered ({detail}); Slurm was not waited for",
            )))
    return blames
