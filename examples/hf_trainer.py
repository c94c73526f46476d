"""A tiny GPT-2 trained by the Hugging Face Trainer on the CPU, reporting to clusterctl through its callback.

What a Trainer user adds to their own script is one argument, the callback:

    trainer = transformers.Trainer(..., callbacks=[ClusterctlCallback()])

(with `include_num_input_tokens_seen=True` the Trainer counts the tokens itself).  `clusterctl status` then
shows the run's loss and tokens/s while it trains.  Run by the testbed's story
tests/e2e/test_framework_callbacks.py.  Needs transformers, accelerate and PyTorch
(`pip install 'clusterctl[frameworks,torch]'`); the model is built from a config, nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

from clusterctl.integrations.transformers import ClusterctlCallback

VOCAB, SEQUENCE, BATCH = 64, 16, 8


class StepTime(transformers.TrainerCallback):
    """A GPU's step takes time; the testbed's CPUs are shared: each optimizer step lasts at least this long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def main() -> None:
    """Train `--steps` optimizer steps and say how long they took."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB,
                                                                 n_positions=SEQUENCE))
    samples = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, VOCAB, (args.steps * BATCH, SEQUENCE))]
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as out:
        training = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=BATCH, logging_steps=10,
            save_strategy="no", report_to=[], use_cpu=True, include_num_input_tokens_seen=True, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=training, train_dataset=samples,
                                       callbacks=[ClusterctlCallback(), StepTime(args.step_time)])
        started = time.monotonic()
        trainer.train()
    print(f"hf-trainer: {args.steps} steps in {time.monotonic() - started:.1f} s; "
          f"{BATCH * SEQUENCE} tokens a step", flush=True)


if __name__ == "__main__":
    main()
