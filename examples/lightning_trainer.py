"""A tiny language model trained by Lightning on the CPU, reporting to clusterctl through its callback.

What a Lightning user adds to their own script is one line, the callback in the Trainer's list:

    trainer = lightning.Trainer(callbacks=[ClusterctlCallback()], ...)

`clusterctl status` then shows the run's loss and tokens/s while it trains, and the hang watch knows a
checkpoint save from a hang.  Run by examples/lightning_trainer.toml (one rank) and by the testbed's story
tests/e2e/test_framework_callbacks.py.  Needs Lightning and PyTorch (`pip install 'clusterctl[frameworks,torch]'`).
"""

from __future__ import annotations

import argparse
import time

import lightning
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment

from clusterctl.integrations.lightning import ClusterctlCallback

VOCAB, WIDTH, SEQUENCE, BATCH = 64, 16, 32, 8


class TinyLM(lightning.LightningModule):
    """An embedding and a linear head: next-token prediction on a fixed random corpus."""

    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.step_time = step_time

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids = batch["input_ids"]
        logits = self.head(self.embed(ids[:, :-1]))
        time.sleep(self.step_time)  # a GPU's step takes time; the testbed's CPUs are shared
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def corpus(batches: int) -> list[dict[str, torch.Tensor]]:
    """Deterministic batches of token ids (a dict with `input_ids`, as Hugging Face collators give)."""
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=generator)} for _ in range(batches)]


def main() -> None:
    """Train `--steps` steps, one log line every `--log-every`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args()
    torch.manual_seed(0)
    # One process, one device: Lightning's own environment, not its SLURM one (which would set up a
    # process group over the job's tasks; this example is one rank).
    trainer = lightning.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, plugins=[LightningEnvironment()],
                                callbacks=[ClusterctlCallback()], enable_checkpointing=False, logger=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                log_every_n_steps=args.log_every)
    started = time.monotonic()
    trainer.fit(TinyLM(args.step_time), train_dataloaders=torch.utils.data.DataLoader(
        corpus(args.steps), batch_size=None))
    print(f"lightning: {args.steps} steps in {time.monotonic() - started:.1f} s; "
          f"{BATCH * SEQUENCE} tokens a step", flush=True)


if __name__ == "__main__":
    main()
