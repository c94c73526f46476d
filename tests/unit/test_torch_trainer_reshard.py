"""The PyTorch example trainer resharded (issue 43, "the examples reshard"): a DCP checkpoint two ranks
saved, resumed on one rank as clusterctl starts it after a shrink (CLUSTERCTL_DP_SIZE=1,
CLUSTERCTL_DP_SIZE_ORIGINAL=2), against the same run left on two ranks.  Ranks are started the way
clusterctl's srun style starts them (RANK / WORLD_SIZE / MASTER_*), on CPU over gloo.  Skipped without
PyTorch (`pip install -e '.[torch]'`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the optional extra: pip install -e '.[torch]')")
pytest.importorskip("numpy", reason="numpy is not installed (torch.distributed's object collectives need it)")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, EVERY = 6, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(world: int, ckpt: Path, *extra: str, env: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """The trainer as `world` ranks on this host; each rank's (exit code, output)."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
    procs = [subprocess.Popen(
        ["nice", "-n", "19", sys.executable, str(EXAMPLES / "torch_trainer.py"), "--checkpoint-dir", str(ckpt),
         "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--loss-log", str(ckpt / "losses.jsonl"),
         "--timeout", "60", *extra],
        env={**base, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LD_LIBRARY_PATH": "/nonexistent", **(env or {})},
        cwd=EXAMPLES, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]
    return [(p.wait(timeout=120), p.communicate()[0]) for p in procs]


def records(ckpt: Path) -> tuple[dict[int, dict], dict[tuple[str, int], str]]:
    """The loss log: its steps by number, and its checkpoints' digests by (event, step)."""
    lines = [json.loads(line) for line in (ckpt / "losses.jsonl").read_text().splitlines()]
    return ({r["step"]: r for r in lines if "loss" in r},
            {(r["event"], r["step"]): r["digest"] for r in lines if "event" in r})


def test_two_ranks_checkpoint_resumed_on_one_rank_goes_on_as_the_two_would(tmp_path):
    whole = tmp_path / "whole"
    whole.mkdir()
    done = ranks(2, whole, "--resume", "none")
    assert [code for code, _ in done] == [0, 0], done
    resume_from = whole / f"step-{EVERY:08d}"
    shrunk = tmp_path / "shrunk"
    shrunk.mkdir()
    [(code, out)] = ranks(1, shrunk, env={"CLUSTERCTL_RESUME_FROM": str(resume_from), "CLUSTERCTL_DP_SIZE": "1",
                                          "CLUSTERCTL_DP_SIZE_ORIGINAL": "2"})
    assert code == 0, out
    assert f"resumed from {resume_from}; world size 1 (2 micro-steps a step: 2 replicas' batch on 1)" in out

    whole_steps, whole_states = records(whole)
    shrunk_steps, shrunk_states = records(shrunk)
    # The state loaded is the state two ranks saved, bit for bit.
    assert shrunk_states[("resumed", EVERY)] == whole_states[("checkpoint", EVERY)]
    assert sorted(shrunk_steps) == list(range(EVERY + 1, STEPS + 1))
    for step, shrunk_step in shrunk_steps.items():
        two = whole_steps[step]
        # The same global batch, in the same order: slot k of the step read the same samples.
        assert shrunk_step["slot_first_samples"] == two["slot_first_samples"]
        assert (shrunk_step["dp_size"], shrunk_step["dp_size_original"], two["dp_size"]) == (1, 2, 2)
        # Measured (docs/measured.md): 2 -> 1 adds the gradients in the order two ranks do, and halving
        # is exact, so the losses are bitwise the same, not merely close.
        assert shrunk_step["slot_losses"] == two["slot_losses"] and shrunk_step["loss"] == two["loss"]
    assert shrunk_states[("checkpoint", STEPS)] == whole_states[("checkpoint", STEPS)]
    final = json.loads((shrunk / "final.json").read_text())
    assert final["digest"] == json.loads((whole / "final.json").read_text())["digest"]
    assert (final["world_size"], final["dp_size_original"]) == (1, 2)


def test_a_data_parallel_size_that_does_not_divide_the_original_is_a_clear_error(tmp_path):
    [(code, out)] = ranks(1, tmp_path, env={"CLUSTERCTL_DP_SIZE": "1", "CLUSTERCTL_DP_SIZE_ORIGINAL": "three"})
    assert code == 2, out
    assert "torch_trainer: CLUSTERCTL_DP_SIZE_ORIGINAL='three' is not a whole number" in out
    assert "Traceback" not in out and not (tmp_path / "final.json").exists()
