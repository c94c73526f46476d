"""Complete checkpoints in the layouts the training frameworks save, read without importing them.

Each validator looks for the file its framework writes *last* and checks that it is whole, as
launcher/shared/checkpoints.py does for clusterctl's own and PyTorch's layouts:

- `hf` (Hugging Face `Trainer`): `checkpoint-N/` whose `trainer_state.json` (the Trainer writes it
  after the model, optimizer, scheduler and RNG states) parses and names step N, next to whole model
  weights: `model.safetensors` (its header and its size agree), `pytorch_model.bin` (a whole
  torch.save archive), their sharded forms (every shard its index names) or a PEFT adapter's;
- `lightning` (Lightning's `ModelCheckpoint`): each `*.ckpt` that is a whole torch.save archive (a
  write cut off lacks the zip directory that ends it), its step the `global_step` it holds;
- `deepspeed` (`engine.save_checkpoint`): the `latest` file (written after every rank saved) naming a
  tag folder whose `mp_rank_00_model_states.pt` and every other `*_states.pt` are whole archives.

A torch.save archive's pickle is read by an unpickler that builds nothing (every class it names
becomes an inert placeholder, every tensor None): only plain numbers such as the step are taken
from it, and no code of the checkpoint's runs.  Nothing here imports torch.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
import zipfile
from pathlib import Path

from clusterctl.launcher.pure.checkpoint import Checkpoint, Skipped

TRAINER_STATE = "trainer_state.json"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
DEEPSPEED_LATEST = "latest"
DEEPSPEED_MODEL_STATES = "mp_rank_00_model_states.pt"
MAX_PICKLE_BYTES = 64 << 20
"""The largest checkpoint pickle read for its step (tensors' bytes are stored beside it, not in it)."""


class _Inert:
    """What every class or function a checkpoint's pickle names becomes: takes anything, does nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        pass

    def extend(self, values: object) -> None:
        pass


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type[_Inert]:
        return _Inert

    def persistent_load(self, pid: object) -> None:
        return None


def torch_archive_problem(path: Path) -> str | None:
    """Why `path` is not a whole torch.save archive (None when it is): zip's central directory is
    written last, so a save cut off has none (its members' bytes are not read: a multi-GB file costs
    one read of its end)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pickles:
                return "no data.pkl in the archive: not a torch.save file"
        return None
    except zipfile.BadZipFile:
        return "not a whole zip archive (a torch.save cut off has no directory at its end)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"


def pickled_number(path: Path, key: str) -> int | None:
    """The integer under `key` in the dict a torch.save archive holds, read without building its
    objects; None when there is none (or the archive cannot be read)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None or archive.getinfo(name).file_size > MAX_PICKLE_BYTES:
                return None
            data = archive.read(name)
        loaded = _InertUnpickler(io.BytesIO(data)).load()
    except Exception:  # a torn or foreign pickle: no number, the caller says why it is skipped
        return None
    value = loaded.get(key) if isinstance(loaded, dict) else None
    return value if type(value) is int else None


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (None when it is): its header (a length, then JSON)
    says where every tensor's bytes end; a file shorter than that was cut off."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) < 8:
                return "shorter than its header"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_PICKLE_BYTES:
                return "header length out of range"
            header = json.loads(file.read(length))
        size = path.stat().st_size
    except (OSError, ValueError) as exc:
        return f"header unreadable: {exc}"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)]
    needed = 8 + length + max(ends, default=0)
    return None if size >= needed else f"{size} bytes where its header needs {needed}: cut off"


def _weights_problem(path: Path) -> str | None:
    return safetensors_problem(path) if path.suffix == ".safetensors" else torch_archive_problem(path)


def hf_weights_problem(folder: Path) -> str | None:
    """Why `folder` (an HF `checkpoint-N/`) holds no whole model weights (None when it does)."""
    for name in HF_WEIGHTS:
        if (folder / name).is_file():
            problem = _weights_problem(folder / name)
            return None if problem is None else f"{name}: {problem}"
    for name in HF_INDEXES:
        if (folder / name).is_file():
            try:
                weight_map = json.loads((folder / name).read_text())["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                return f"{name} unreadable: {exc}"
            for shard in shards:
                if not (folder / shard).is_file():
                    return f"{shard} (named by {name}) is missing"
                problem = _weights_problem(folder / shard)
                if problem is not None:
                    return f"{shard}: {problem}"
            return None
    if (folder / DEEPSPEED_LATEST).is_file():  # the Trainer under DeepSpeed: the engine's own layout inside
        found, skipped = deepspeed_checkpoints(folder)
        return None if found else (skipped[0].why if skipped else "DeepSpeed's latest names nothing whole")
    return f"no model weights ({', '.join(HF_WEIGHTS[:2])} or a sharded index)"


def hf_checkpoints(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    """The Hugging Face Trainer's `checkpoint-N/` folders in `directory`: complete, or skipped with why."""
    good, skipped = [], []
    for candidate in sorted(directory.glob("checkpoint-*")):
        found = re.fullmatch(r"checkpoint-(\d+)", candidate.name)
        if found is None or not candidate.is_dir():
            continue
        step = int(found.group(1))
        state_path = candidate / TRAINER_STATE
        try:
            state = json.loads(state_path.read_text())
        except FileNotFoundError:
            skipped.append(Skipped(str(candidate), f"no {TRAINER_STATE} (the Trainer writes it last): incomplete"))
            continue
        except (OSError, ValueError) as exc:
            skipped.append(Skipped(str(candidate), f"{TRAINER_STATE} unreadable: {exc}"))
            continue
        if not isinstance(state, dict) or state.get("global_step") != step:
            named = state.get("global_step") if isinstance(state, dict) else None
            skipped.append(Skipped(str(candidate), f"{TRAINER_STATE} names step {named!r}, not {step}"))
            continue
        problem = hf_weights_problem(candidate)
        if problem is not None:
            skipped.append(Skipped(str(candidate), problem))
            continue
        good.append(Checkpoint(str(candidate), step, "hf", state_path.stat().st_mtime))
    return good, skipped


def lightning_checkpoints(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    """Lightning's `*.ckpt` files in `directory` (ModelCheckpoint's dirpath): whole, with the step they hold."""
    good, skipped = [], []
    for candidate in sorted(directory.glob("*.ckpt")):
        if not candidate.is_file():  # a DeepSpeed strategy's .ckpt is a folder: the deepspeed validator's
            continue
        problem = torch_archive_problem(candidate)
        if problem is not None:
            skipped.append(Skipped(str(candidate), problem))
            continue
        step = pickled_number(candidate, "global_step")
        if step is None:
            skipped.append(Skipped(str(candidate), "holds no global_step: not a Lightning checkpoint"))
            continue
        good.append(Checkpoint(str(candidate), step, "lightning", candidate.stat().st_mtime))
    return good, skipped


def deepspeed_checkpoints(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    """DeepSpeed's checkpoint in `directory`: the tag its `latest` file names, when every states file is whole."""
    tracker = directory / DEEPSPEED_LATEST
    try:
        tag = tracker.read_text().strip()
    except OSError:
        return [], []
    folder = directory / tag
    if not tag or "/" in tag or tag.startswith(".") or not folder.is_dir():
        return [], [Skipped(str(tracker), f"names {tag[:40]!r}, which is not a folder here")]
    if not (folder / DEEPSPEED_MODEL_STATES).is_file():
        return [], [Skipped(str(folder), f"no {DEEPSPEED_MODEL_STATES}")]
    for states in sorted(folder.glob("*_states.pt")):
        problem = torch_archive_problem(states)
        if problem is not None:
            return [], [Skipped(str(folder), f"{states.name}: {problem}")]
    found = re.search(r"(\d+)$", tag)
    step = int(found.group(1)) if found else pickled_number(folder / DEEPSPEED_MODEL_STATES, "global_steps")
    if step is None:
        return [], [Skipped(str(folder), f"no step in the tag {tag[:40]!r} or in {DEEPSPEED_MODEL_STATES}")]
    return [Checkpoint(str(folder), step, "deepspeed", tracker.stat().st_mtime)], []
