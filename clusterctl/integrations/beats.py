"""What the framework callbacks share, free of any framework: the phase a rank is in, the beats
that say it, and the clear error when a framework is missing."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from clusterctl.progress import beat

EXTRA_HINT = "pip install 'clusterctl[frameworks]'"


class FrameworkMissing(ImportError):
    """A clusterctl integration was imported where its framework is not installed."""


def require(modules: tuple[str, ...], integration: str, package: str) -> ModuleType:
    """The first of the framework's `modules` that imports (its names, newest first), for the integration
    `integration`; FrameworkMissing, saying how to install `package`, when none does."""
    failures = []
    for module in modules:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            failures.append(f"{module}: {exc}")
    raise FrameworkMissing(
        f"{integration} needs {package}, which this Python cannot import ({'; '.join(failures)}); install it "
        f"with {EXTRA_HINT} (or pip install {package}), or drop the callback")


def batch_tokens(batch: object) -> int | None:
    """The tokens in a batch of a language model's inputs: the size of its `input_ids` (a mapping's
    entry or an attribute, as tokenizers and data collators give them); None for any other batch."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else getattr(batch, "input_ids", None)
    numel = getattr(ids, "numel", None)
    if callable(numel):
        count = numel()
        return count if isinstance(count, int) else None
    return None


class RankBeats:
    """One rank's beats from a framework's hooks: its steps with their loss and tokens, and a
    checkpoint save or load marked from its start until the next step ends it."""

    def __init__(self) -> None:
        self.phase = "step"

    def step(self, step: int, *, tokens: float | None = None, loss: object = None,
             grad_norm: object = None) -> None:
        """This rank finished `step` (a save or load before it is over), with this step's tokens (its share)
        and the loss and gradient norm as of this step (numbers or tensors: read only when a report is written)."""
        beat(step, tokens=tokens, loss=loss, grad_norm=grad_norm)
        self.phase = "step"

    def note(self, step: int, *, loss: object = None, grad_norm: object = None) -> None:
        """The loss and gradient norm as of `step`, said in the phase the rank is in (a save under way stays one)."""
        beat(step, self.phase, loss=loss, grad_norm=grad_norm)

    def saving(self, step: int) -> None:
        """A checkpoint save of `step` begins."""
        self._enter(step, "checkpoint-save")

    def loading(self, step: int) -> None:
        """A checkpoint load begins (at `step`: the step known before it, often 0)."""
        self._enter(step, "checkpoint-load")

    def resumed(self, step: int) -> None:
        """A save or load is over without a step to report yet (training starts, or ends, after it)."""
        if self.phase != "step":
            self.step(step)

    def _enter(self, step: int, phase: str) -> None:
        beat(step, phase)
        self.phase = phase
