"""A Lightning callback that reports this rank's progress to clusterctl: each training batch's step,
loss and tokens (clusterctl.progress.beat), and checkpoint saves and loads as their phases, so
`clusterctl status` shows the loss and tokens/s and the hang watch knows a slow save from a hang::

    from clusterctl.integrations.lightning import ClusterctlCallback
    trainer = lightning.Trainer(callbacks=[ClusterctlCallback()], ...)

The tokens of a batch are the size of its `input_ids` (a dict batch, as Hugging Face collators
give); for any other batch pass `tokens=` the count per batch on this rank, or a function of the
batch.  A save is marked from Lightning's `on_save_checkpoint` (before the file is written) until the
next batch; a load from `on_load_checkpoint` (the file read, the states not yet restored) until
training starts.  Outside a clusterctl job the beats do nothing.

Needs Lightning (`lightning`, else the older `pytorch_lightning`): installed by clusterctl's
`frameworks` extra, never by its base install.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clusterctl.integrations.beats import RankBeats, batch_tokens, require

# `pytorch_lightning` is the package's older name, with its own Callback class: a Trainer of one takes only its own.
_pl = require(("lightning.pytorch", "pytorch_lightning"), "clusterctl.integrations.lightning", "lightning")

__all__ = ["ClusterctlCallback"]


class ClusterctlCallback(_pl.Callback):  # type: ignore[name-defined]
    """Beats from Lightning's training loop: every batch with its loss and tokens, checkpoint phases."""

    def __init__(self, tokens: int | Callable[[Any], int | None] | None = None) -> None:
        """`tokens`: this rank's tokens in each batch, or a function of the batch that counts them;
        default: the size of the batch's `input_ids`, none for a batch without one."""
        super().__init__()
        self._tokens = tokens
        self._beats = RankBeats()

    def _count(self, batch: object) -> int | None:
        if self._tokens is None:
            return batch_tokens(batch)
        return self._tokens if isinstance(self._tokens, int) else self._tokens(batch)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._beats.resumed(trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        self._beats.step(trainer.global_step, tokens=self._count(batch), loss=loss)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._beats.saving(trainer.global_step)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step")
        self._beats.loading(step if isinstance(step, int) else trainer.global_step)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._beats.resumed(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._beats.resumed(trainer.global_step)
