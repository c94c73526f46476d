"""A Hugging Face `TrainerCallback` that reports this rank's progress to clusterctl: each optimizer
step with its tokens, the loss and gradient norm the Trainer logs (clusterctl.progress.beat), and
each checkpoint save as its phase, so `clusterctl status` shows the loss and tokens/s and the hang
watch knows a slow save from a hang::

    from clusterctl.integrations.transformers import ClusterctlCallback
    trainer = transformers.Trainer(..., callbacks=[ClusterctlCallback()])

Tokens come from the Trainer's own count when it keeps one (`include_num_input_tokens_seen`; the
count is the whole job's, so each rank reports its 1/world_size share), else pass `tokens_per_step=`
this rank's tokens per optimizer step.  The loss is the Trainer's logged one (every `logging_steps`).
A save is marked from the step that the Trainer decides to save after (`on_step_end`, once its
`DefaultFlowCallback` set `should_save`) until `on_save`; a save decided later (the `best` strategy,
after an evaluation) is not marked.  The Trainer has no hook before it loads a checkpoint to resume
from, so loads are not marked.  Outside a clusterctl job the beats do nothing.

Needs transformers (and PyTorch): installed by clusterctl's `frameworks` extra, never by its base install.
"""

from __future__ import annotations

from typing import Any

from clusterctl.integrations.beats import RankBeats, require

_transformers = require(("transformers",), "clusterctl.integrations.transformers", "transformers")

__all__ = ["ClusterctlCallback"]


class ClusterctlCallback(_transformers.TrainerCallback):  # type: ignore[name-defined]
    """Beats from the Hugging Face Trainer's loop: every optimizer step with its tokens, the logged loss
    and gradient norm, checkpoint saves."""

    def __init__(self, tokens_per_step: int | None = None) -> None:
        """`tokens_per_step`: this rank's tokens per optimizer step, for a Trainer that does not count
        them (`include_num_input_tokens_seen` off, its default)."""
        self._tokens_per_step = tokens_per_step
        self._tokens_seen = 0
        self._beats = RankBeats()

    def _step_tokens(self, args: Any, state: Any) -> float | None:
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        new, self._tokens_seen = seen - self._tokens_seen, seen
        if new > 0:
            return new / max(int(getattr(args, "world_size", 1) or 1), 1)
        return self._tokens_per_step

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)  # a resume starts from its count
        self._beats.resumed(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._beats.step(state.global_step, tokens=self._step_tokens(args, state))
        if control.should_save:
            self._beats.saving(state.global_step)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save and self._beats.phase == "step":
            self._beats.saving(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" in logs or "grad_norm" in logs:
            self._beats.note(state.global_step, loss=logs.get("loss"), grad_norm=logs.get("grad_norm"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._beats.resumed(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._beats.resumed(state.global_step)
