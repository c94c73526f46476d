"""clusterctl's callbacks inside the real Lightning and Hugging Face Trainer loops (on CPU, a tiny model,
a few steps): the rank's progress report, read as the node's reporter reads it, carries the loss and
the tokens, and says "checkpoint-save" while the framework writes a checkpoint, which the validator of
that framework's layout then finds complete.  Skipped where the framework is not installed
(pip install 'clusterctl[frameworks]', or scripts/setup.sh with CLUSTERCTL_TORCH=1)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.launcher.shared.checkpoints import find_checkpoints
from clusterctl.records.rank_progress import read_progress

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node_dir(tmp_path, monkeypatch):
    """A rank of a clusterctl job whose node has a reporter: beats land in this node-local folder."""
    here = tmp_path / "node"
    monkeypatch.setenv("CLUSTERCTL_NODE_DIR", str(here))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("CLUSTERCTL_PROGRESS_INTERVAL", "0")  # every beat written: each phase is seen
    monkeypatch.setenv("CLUSTERCTL_PROGRESS_LIVENESS", "0")
    return here


def _report(node_dir: Path):
    (record,), problems = read_progress(node_dir)
    assert problems == ()
    return record


def test_the_lightning_callback_beats_with_loss_and_tokens_and_marks_saves_and_loads(tmp_path, node_dir):
    pytest.importorskip("lightning", reason="Lightning is not installed (the `frameworks` extra)")
    import lightning
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from clusterctl.integrations.lightning import ClusterctlCallback

    class TinyLM(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(32, 8)
            self.head = torch.nn.Linear(8, 32)

        def training_step(self, batch, batch_idx):
            ids = batch["input_ids"]
            return torch.nn.functional.cross_entropy(self.head(self.embed(ids)).flatten(0, 1), ids.flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    seen_while_saving = []

    class WatchedIO(TorchCheckpointIO):  # Lightning's own writer, watched: what the reporter reads meanwhile
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            seen_while_saving.append((_report(node_dir).phase, _report(node_dir).step, checkpoint["global_step"]))
            super().save_checkpoint(checkpoint, path, storage_options)

    seen_at_start = []

    class WatchStart(lightning.Callback):
        def on_train_start(self, trainer, pl_module):
            seen_at_start.append([r.phase for r in read_progress(node_dir)[0]])

    samples = [{"input_ids": torch.randint(0, 32, (8,))} for _ in range(24)]
    loader = torch.utils.data.DataLoader(samples, batch_size=4)  # 32 tokens per batch
    ckpt_dir = tmp_path / "ckpt"

    def trainer(max_steps: int) -> lightning.Trainer:
        return lightning.Trainer(
            max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, plugins=[WatchedIO()],
            callbacks=[WatchStart(), ClusterctlCallback(),
                       ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)])

    torch.manual_seed(0)
    trainer(6).fit(TinyLM(), loader)

    assert seen_while_saving == [("checkpoint-save", 3, 3), ("checkpoint-save", 6, 6)]
    after = _report(node_dir)
    assert (after.phase, after.step, after.tokens, after.loss_step) == ("step", 6, 6 * 32, 6)
    assert math.isfinite(after.loss) and after.loss > 0

    found, skipped = find_checkpoints(ckpt_dir, "lightning")
    assert [c.step for c in found] == [3, 6] and skipped == []
    newest = found[-1].path

    trainer(7).fit(TinyLM(), loader, ckpt_path=newest)  # a resume: the load is marked until training starts
    assert seen_at_start == [[], ["checkpoint-load"]]  # nothing reported before the first fit
    assert _report(node_dir).step == 7

    cut = ckpt_dir / "epoch=0-step=9.ckpt"  # a save cut off: no zip directory at its end
    cut.write_bytes(Path(newest).read_bytes()[:-100])
    found, skipped = find_checkpoints(ckpt_dir, "auto")
    assert [c.step for c in found] == [3, 6] and [s.path for s in skipped] == [str(cut)]
    assert "not a whole zip archive" in skipped[0].why


def test_the_hugging_face_callback_beats_with_loss_and_tokens_and_marks_saves(tmp_path, node_dir):
    pytest.importorskip("transformers", reason="transformers is not installed (the `frameworks` extra)")
    import torch
    import transformers

    from clusterctl.integrations.transformers import ClusterctlCallback

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    samples = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (16, 8))]
    seen_while_saving = []

    class WatchedTrainer(transformers.Trainer):  # the Trainer's own save, watched: what the reporter reads meanwhile
        def save_model(self, output_dir=None, _internal_call=False):
            seen_while_saving.append((_report(node_dir).phase, _report(node_dir).step, self.state.global_step))
            super().save_model(output_dir, _internal_call)

    out = tmp_path / "out"
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=2, save_steps=2, logging_steps=1,
        report_to=[], use_cpu=True, include_num_input_tokens_seen=True, disable_tqdm=True)
    WatchedTrainer(model=model, args=args, train_dataset=samples, callbacks=[ClusterctlCallback()]).train()

    assert seen_while_saving == [("checkpoint-save", 2, 2), ("checkpoint-save", 4, 4)]
    after = _report(node_dir)
    assert (after.phase, after.step, after.tokens, after.loss_step) == ("step", 4, 4 * 2 * 8, 4)
    assert math.isfinite(after.loss) and after.loss > 0 and after.grad_norm is not None

    found, skipped = find_checkpoints(out, "hf")
    assert [c.step for c in found] == [2, 4] and skipped == []
    (out / "checkpoint-4" / "trainer_state.json").unlink()  # a save cut off before its last file
    weights = out / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    found, skipped = find_checkpoints(out, "auto")
    assert found == [] and [Path(s.path).name for s in skipped] == ["checkpoint-2", "checkpoint-4"]
    assert "cut off" in skipped[0].why and "trainer_state.json" in skipped[1].why


def test_an_integration_without_its_framework_says_how_to_install_it(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    for name in ("lightning", "pytorch_lightning", "transformers"):  # a package that fails to import, as a missing one
        (blocker / name).mkdir()
        (blocker / name / "__init__.py").write_text("raise ImportError('not installed here')\n")
    for module in ("clusterctl.integrations.lightning", "clusterctl.integrations.transformers"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": f"{blocker}:{REPO}", "PATH": "/usr/bin:/bin"})
        assert done.returncode == 1
        assert "pip install 'clusterctl[frameworks]'" in done.stderr and "drop the callback" in done.stderr
    done = subprocess.run([sys.executable, "-c", "import clusterctl.integrations, clusterctl.progress, sys; "
                           "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))"],
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "[]"
