"""The PyTorch example trainer under a real torchrun (one node, three ranks over gloo on CPU: three,
because a sum of three floats depends on its order and two commute), and the supervisor's DCP validator on checkpoints PyTorch itself wrote.  Skipped without PyTorch
(`pip install -e '.[torch]'`, or `CLUSTERCTL_TORCH=1 bash scripts/setup.sh`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.launcher.shared.checkpoints import find_checkpoints, latest_complete

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the optional extra: pip install -e '.[torch]')")
pytest.importorskip("numpy", reason="numpy is not installed (torch.distributed's object collectives need it)")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ckpt: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The trainer on one node with three ranks, static rendezvous, as clusterctl's torchrun style starts it."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3", "--node-rank=0",
            "--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={_free_port()}",
            str(EXAMPLES / "torch_trainer.py"), "--checkpoint-dir", str(ckpt), "--steps", str(STEPS),
            "--checkpoint-every", "10", *extra]
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "CLUSTERCTL_RESUME_FROM")}
    environ["LD_LIBRARY_PATH"] = "/nonexistent"  # no NVML here: GPU checks off
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env={**environ, **(env or {})},
                          cwd=EXAMPLES)


def final(ckpt: Path) -> dict:
    return json.loads((ckpt / "final.json").read_text())


def test_a_rank_killed_mid_save_leaves_a_checkpoint_the_supervisor_skips_and_resume_is_bit_identical(tmp_path):
    uninterrupted = tmp_path / "uninterrupted"
    done = torchrun(uninterrupted)
    assert done.returncode == 0, done.stdout + done.stderr
    ckpt = tmp_path / "interrupted"
    killed = torchrun(ckpt, "--die-during-save", "20")
    assert killed.returncode != 0 and "killed during save" in killed.stdout, killed.stdout + killed.stderr
    cut = ckpt / "step-00000020"
    assert list(cut.glob("*.distcp")) and not (cut / ".metadata").exists()  # shards, but no .metadata
    best, skipped = latest_complete(ckpt, "dcp")
    assert Path(best.path).name == "step-00000010"
    assert [(Path(s.path).name, s.why) for s in skipped] == [
        ("step-00000020", "no .metadata (DCP writes it after every shard): incomplete")]

    # Left to itself (--resume auto) the trainer skips the cut-off one too; the supervisor's choice wins.
    resumed = torchrun(ckpt, env={"CLUSTERCTL_RESUME_FROM": best.path})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {best.path}" in resumed.stdout
    assert final(ckpt) == final(uninterrupted) and final(ckpt)["step"] == STEPS
    # Everything PyTorch wrote on the way is accepted, the re-saved step 20 included.
    good, skipped = find_checkpoints(ckpt, "dcp")
    assert [Path(c.path).name for c in good] == ["step-00000010", "step-00000020", "step-00000030"] and not skipped


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled", "ignore:Detected an existing checkpoint")
def test_a_save_over_an_older_checkpoint_that_is_cut_off_is_not_complete(tmp_path):
    import torch.distributed.checkpoint as dcp

    class DiesBeforeMetadata(dcp.FileSystemWriter):
        def finish(self, metadata, results):
            raise RuntimeError("the coordinator died before writing .metadata")

    path = tmp_path / "step-00000040"
    dcp.save({"w": torch.zeros(64)}, storage_writer=dcp.FileSystemWriter(str(path), overwrite=True))
    assert Path(latest_complete(tmp_path, "dcp")[0].path) == path
    time.sleep(0.02)  # the new shards' mtime must differ from the old .metadata's
    with pytest.raises(dcp.CheckpointException, match="before writing .metadata"):
        dcp.save({"w": torch.ones(64)}, storage_writer=DiesBeforeMetadata(str(path), overwrite=True))
    assert (path / ".metadata").exists()  # the old one: DCP replaces it only at the very end
    best, skipped = latest_complete(tmp_path, "dcp")
    assert best is None
    assert [s.why for s in skipped] == [
        "__0_0.distcp is newer than .metadata (a later save into this directory was cut off): incomplete"]


def test_with_multi_level_checkpoints_every_rank_saves_its_state_to_the_node_and_resumes_bit_identical(tmp_path):
    from clusterctl.records.checkpoint_settings import CheckpointSettings
    from clusterctl.records.tier_index import TierSlot, write_tier_index

    def tiered(run: str, resume_step: int | None) -> dict[str, str]:
        launch = tmp_path / run / f"launch-{resume_step}"
        launch.mkdir(parents=True, exist_ok=True)
        index = launch / "tiers.idx"
        where = ("shared", "node1", "-") if resume_step is not None else ("-", "-", "-")
        write_tier_index(index, resume_step, [TierSlot("node1", "-", *where)])
        settings = CheckpointSettings(run_key="00000000000000bb", local_base=str(tmp_path / "node1-shm"),
                                      shared_dir=str(tmp_path / run / "shared"), tier_index=str(index),
                                      port=_free_port(), flush_every_steps=10, resume_step=resume_step)
        return {**settings.to_env(), "SLURMD_NODENAME": "node1", "CLUSTERCTL_REPORT_KEY": "cd" * 32}

    whole = torchrun(tmp_path / "whole" / "shared", env=tiered("whole", None))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "checkpoint step 10 saved to the node tier" in whole.stdout
    cut = torchrun(tmp_path / "split" / "shared", "--steps", "15", env=tiered("split", None))
    assert cut.returncode == 0, cut.stdout + cut.stderr
    resumed = torchrun(tmp_path / "split" / "shared", env=tiered("split", 10))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from step 10 (shared storage)" in resumed.stdout
    assert final(tmp_path / "split" / "shared") == final(tmp_path / "whole" / "shared")
