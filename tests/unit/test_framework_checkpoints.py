"""The checkpoint validators of the frameworks' layouts on what those layouts hold when a save was cut
off, named wrong or is whole (the real libraries' own saves: tests/unit/test_framework_callbacks.py).

DeepSpeed is not installed by the `frameworks` extra (it builds from source and, on CPU, compiles a
C++ op when it starts): its `latest` layout is written here as DeepSpeed documents it, each states
file by torch.save as DeepSpeed's engine writes it (a real save of DeepSpeed 0.19.8 was checked against
the validator once by hand: docs/measured.md)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from clusterctl.errors import SpecError
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.launcher.shared.checkpoints import find_checkpoints, latest_complete, markers
from clusterctl.launcher.shared.framework_checkpoints import pickled_number, safetensors_problem


def _safetensors(path: Path, sizes: dict[str, int]) -> None:
    """A safetensors file as its format is specified: an 8-byte header length, the JSON header, the bytes."""
    header, at = {}, 0
    for name, size in sizes.items():
        header[name] = {"dtype": "F32", "shape": [size // 4], "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(at))


def _hf_checkpoint(root: Path, step: int) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    _safetensors(folder / "model.safetensors", {"w": 64, "b": 8})
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def test_hf_checkpoints_are_complete_only_with_their_state_and_whole_weights(tmp_path):
    _hf_checkpoint(tmp_path, 10)
    cut = _hf_checkpoint(tmp_path, 20)
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:-1])
    unfinished = _hf_checkpoint(tmp_path, 30)
    (unfinished / "trainer_state.json").unlink()
    renamed = _hf_checkpoint(tmp_path, 40)
    (renamed / "trainer_state.json").write_text(json.dumps({"global_step": 39}))
    sharded = tmp_path / "checkpoint-50"
    sharded.mkdir()
    (sharded / "trainer_state.json").write_text(json.dumps({"global_step": 50}))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    _safetensors(sharded / "model-00001-of-00002.safetensors", {"a": 16})

    best, newer = latest_complete(tmp_path, "hf")
    assert best is not None and (best.step, best.validator) == (10, "hf")
    assert {Path(s.path).name: s.why for s in newer} == {
        "checkpoint-20": "model.safetensors: 205 bytes where its header needs 206: cut off",
        "checkpoint-30": "no trainer_state.json (the Trainer writes it last): incomplete",
        "checkpoint-40": "trainer_state.json names step 39, not 40",
        "checkpoint-50": "model-00002-of-00002.safetensors (named by model.safetensors.index.json) is missing",
    }
    _safetensors(sharded / "model-00002-of-00002.safetensors", {"b": 16})
    assert latest_complete(tmp_path, "auto")[0].path == str(sharded)


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_any_bytes_as_safetensors_or_torch_archive_are_judged_never_raise(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "model.safetensors"
    path.write_bytes(data)
    assert safetensors_problem(path) is None or isinstance(safetensors_problem(path), str)
    assert pickled_number(path, "global_step") is None
    (path.parent / "epoch=0-step=1.ckpt").write_bytes(data)
    found, skipped = find_checkpoints(path.parent, "lightning")
    assert found == [] and len(skipped) == 1


def _deepspeed_checkpoint(root: Path, tag: str, step: int, ranks: int = 2) -> Path:
    """DeepSpeed's documented layout: <dir>/<tag>/mp_rank_00_model_states.pt (the module and the step) and
    one ZeRO optimizer states file per data-parallel rank; `latest` names the tag, written last."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra): no torch.save files")
    folder = root / tag
    folder.mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(4)}, "global_steps": step, "dp_world_size": ranks, "mp_world_size": 1,
                "ds_version": "0.19.8"}, folder / "mp_rank_00_model_states.pt")
    for rank in range(ranks):
        torch.save({"optimizer_state_dict": {"state": {}}, "ds_version": "0.19.8"},
                   folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (root / "latest").write_text(tag)
    return folder


def test_deepspeed_checkpoint_is_the_tag_latest_names_when_its_states_are_whole(tmp_path):
    first = _deepspeed_checkpoint(tmp_path, "global_step100", 100)
    assert [(c.path, c.step, c.validator) for c in find_checkpoints(tmp_path, "deepspeed")[0]] == [
        (str(first), 100, "deepspeed")]
    assert (tmp_path / "latest", None) in markers(tmp_path, "deepspeed")

    named = _deepspeed_checkpoint(tmp_path, "final", 180)  # a tag of the user's: the step is read from the states
    assert [c.step for c in find_checkpoints(tmp_path, "auto")[0]] == [180]

    optim = named / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[:-30])
    assert find_checkpoints(tmp_path, "deepspeed") == ([], find_checkpoints(tmp_path, "deepspeed")[1])
    (why,) = [s.why for s in find_checkpoints(tmp_path, "deepspeed")[1]]
    assert why.startswith("zero_pp_rank_1_mp_rank_00_optim_states.pt: not a whole zip archive")

    (tmp_path / "latest").write_text("global_step200")
    assert [s.why for s in find_checkpoints(tmp_path, "deepspeed")[1]] == [
        "names 'global_step200', which is not a folder here"]


def test_lightning_checkpoint_of_a_name_without_a_step_gives_the_step_it_holds(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra): no torch.save files")
    torch.save({"global_step": 42, "epoch": 3, "state_dict": {"w": torch.ones(2)}}, tmp_path / "last.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "weights.ckpt")
    found, skipped = find_checkpoints(tmp_path, "lightning")
    assert [(Path(c.path).name, c.step) for c in found] == [("last.ckpt", 42)]
    assert [(Path(s.path).name, s.why) for s in skipped] == [
        ("weights.ckpt", "holds no global_step: not a Lightning checkpoint")]


def test_the_spec_takes_the_frameworks_validators_and_names_them_when_refusing(tmp_path):
    def spec(validator: str) -> str:
        return (f'[job]\nname = "t"\nnodes = 1\n[launch]\ncommand = ["true"]\n'
                f'[checkpoint]\ndir = "{tmp_path}"\nvalidator = "{validator}"\n')

    for name in ("hf", "lightning", "deepspeed"):
        assert parse_spec(spec(name), "job.toml", base_dir=tmp_path).checkpoint.validator == name
    with pytest.raises(SpecError, match="hf.*lightning.*deepspeed"):
        parse_spec(spec("keras"), "job.toml", base_dir=tmp_path)
