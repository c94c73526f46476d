"""Where a step's resume came from: after a step that resumes from a checkpoint starts, its nodes say in
their holdings where each loaded its part from; once all have (or the step ended), the run's journal gets
one `Resumed` line, the plan beside what the nodes said.  Reading what they said and building the line is
`clusterctl.launcher.pure.checkpoint_tiers` (`resume_said`, `resumed_event`); this module keeps the state
between the step's launch and that line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from clusterctl.launcher.pure.checkpoint_tiers import SlotSource, resume_said, resumed_event
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, LastResume
from clusterctl.records.run_journal import Resumed


@dataclass
class Resuming:
    """A step resuming from checkpoint `step` (started as restart `restart` at `started_at`, epoch s): where
    its slots' parts were planned to come from, each node's resume from before the step (an earlier launch's)
    and the resumes of this step its nodes said so far."""

    step: int
    sources: tuple[SlotSource, ...]
    restart: int
    started_at: float
    before: dict[str, LastResume | None]
    said: dict[str, LastResume] = field(default_factory=dict)


class ResumeWatch:
    """The resume of the step launched last, from its launch to its journal line."""

    def __init__(self) -> None:
        self.resuming: Resuming | None = None
        """The running step's resume, until its journal line is written."""
        self._launched: tuple[int, tuple[SlotSource, ...]] | None = None

    def launched(self, step: int | None, sources: tuple[SlotSource, ...]) -> None:
        """A step was launched to resume from checkpoint `step` (None: from nothing), its slots' parts from
        `sources`."""
        self._launched = (step, sources) if step is not None else None

    def step_started(self, restart: int, started_at: float, holdings: Mapping[str, CheckpointHoldings]) -> None:
        """The step launched last started (as restart `restart`; 0: the job's first step) at `started_at`
        (epoch s), its nodes' holdings before it `holdings`: watch them for their resumes of its checkpoint."""
        launched, self._launched = self._launched, None
        self.resuming = None
        if launched is None:
            return
        step, sources = launched
        before = {s.node: held.last_resume if (held := holdings.get(s.node)) is not None else None
                  for s in sources}
        self.resuming = Resuming(step, sources, restart, started_at, before)

    def resume_line(self, holdings: Mapping[str, CheckpointHoldings], job_id: str, now: float, *,
                    step_ended: bool = False) -> Resumed | None:
        """The journal's line about the running step's resume, once every node of the step said its resume
        in its holdings (or, `step_ended`, with what they said: the rest as planned); None while waiting,
        when the step resumed from nothing, or once the line was given."""
        r = self.resuming
        if r is None:
            return None
        waiting = [s.node for s in r.sources if s.node not in r.said]
        r.said.update(resume_said(holdings, waiting, r.step, r.started_at, r.before))
        if len(r.said) < len(r.sources) and not step_ended:
            return None
        self.resuming = None
        return resumed_event(at=now, job_id=job_id, restart=r.restart, step=r.step, planned=r.sources, said=r.said)
