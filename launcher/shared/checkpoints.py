"""Find the newest checkpoint that is really complete.

A checkpoint is complete when the marker its writer puts down *last* is there and sound:

- `manifest`: clusterctl's protocol (the example trainer): `step-NNNNNNNN/manifest.json`
  written after every other file, with the payload's checksum;
- `dcp`: PyTorch Distributed Checkpoint, whose `.metadata` file is written by the
  coordinator after all ranks saved their shards;
- `megatron`: `latest_checkpointed_iteration.txt` (rewritten after an iteration is saved)
  naming an `iter_NNNNNNN/` directory that exists;
- `hf`, `lightning`, `deepspeed`: the Hugging Face Trainer's `checkpoint-N/`, Lightning's `*.ckpt`
  and DeepSpeed's `latest` (launcher/shared/framework_checkpoints.py);
- `tiers` (multi-level checkpoints, never guessed by `auto`): `tiers/step-NNNNNNNNNNNN/complete.json`,
  written by the job's agent once every slot's part is flushed.

Anything else — a temp directory, a manifest that does not parse, a checksum that does not
match — is skipped, and the reason is reported so the supervisor can log it.

`markers` says what to stat to learn, without reading a checkpoint, that a newer one may have become
complete (what `clusterctl status --watch` stats each interval).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from clusterctl.launcher.pure.checkpoint import Checkpoint, Skipped
from clusterctl.launcher.shared.checkpoint_inventory import COMPLETE_NAME, TIERS_DIR, read_complete
from clusterctl.launcher.shared.framework_checkpoints import (
    DEEPSPEED_LATEST,
    deepspeed_checkpoints,
    hf_checkpoints,
    lightning_checkpoints,
)
from clusterctl.records.versioned import RecordError
from clusterctl.text import one_line


def _step_of(name: str) -> int | None:
    found = re.search(r"(\d+)(?:\.ckpt)?$", name)
    return int(found.group(1)) if found else None


def _manifest(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    good, skipped = [], []
    for candidate in directory.glob("step-*"):
        if not candidate.is_dir():
            continue
        manifest_path = candidate / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            skipped.append(Skipped(str(candidate), "no manifest.json (written last): incomplete"))
            continue
        except (OSError, ValueError) as exc:
            skipped.append(Skipped(str(candidate), f"manifest.json unreadable: {exc}"))
            continue
        try:
            payload = (candidate / "params.json").read_bytes()
        except OSError:
            skipped.append(Skipped(str(candidate), "params.json missing"))
            continue
        if not isinstance(manifest, dict) or hashlib.sha256(payload).hexdigest() != manifest.get("params_sha256"):
            skipped.append(Skipped(str(candidate), "params.json does not match the manifest's checksum"))
            continue
        step = manifest.get("step")
        if not isinstance(step, int):
            skipped.append(Skipped(str(candidate), "manifest has no step"))
            continue
        good.append(Checkpoint(str(candidate), step, "manifest", manifest.get("written_at"),
                               manifest.get("save_seconds")))
    return good, skipped


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # removed while we looked: no evidence either way
        return -1


def _dcp(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    good, skipped = [], []
    for candidate in directory.iterdir() if directory.is_dir() else ():
        if not candidate.is_dir() or candidate.name.startswith("."):
            continue
        step = _step_of(candidate.name)
        has_shards = any(candidate.glob("*.distcp"))
        if step is None or not has_shards and not (candidate / ".metadata").exists():
            continue
        metadata = candidate / ".metadata"
        if not metadata.is_file() or metadata.stat().st_size == 0:
            skipped.append(Skipped(str(candidate), "no .metadata (DCP writes it after every shard): incomplete"))
            continue
        # A save into a directory that already held a checkpoint rewrites the shards first and
        # replaces .metadata last: shards newer than .metadata are a later save that was cut off.
        written = metadata.stat().st_mtime_ns
        newer = sorted(s.name for s in candidate.glob("*.distcp") if _mtime_ns(s) > written)
        if newer:
            skipped.append(Skipped(str(candidate), f"{newer[0]} is newer than .metadata (a later save into this "
                                                   "directory was cut off): incomplete"))
            continue
        good.append(Checkpoint(str(candidate), step, "dcp", metadata.stat().st_mtime))
    return good, skipped


def _megatron(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    tracker = directory / "latest_checkpointed_iteration.txt"
    try:
        text = tracker.read_text().strip()
    except OSError:
        return [], []
    if text == "release":
        return [Checkpoint(str(directory / "release"), 0, "megatron")], []
    if not text.isdigit():
        return [], [Skipped(str(tracker), f"does not hold an iteration number: {text[:40]!r}")]
    iteration = int(text)
    path = directory / f"iter_{iteration:07d}"
    if not path.is_dir():
        return [], [Skipped(str(path), "named by latest_checkpointed_iteration.txt but missing")]
    return [Checkpoint(str(path), iteration, "megatron", tracker.stat().st_mtime)], []


def _tiers(directory: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    """Multi-level checkpoints' shared tier: `tiers/step-N/` is complete once the job's agent wrote its
    complete.json (every slot's part flushed; launcher/shared/checkpoint_inventory.py); each slot's part is
    verified against its manifest where it is loaded.  Its cost is the slowest slot's save (complete.json's
    `save_seconds`: the local save training waited for, not the flush behind it)."""
    good, skipped = [], []
    for candidate in sorted((directory / TIERS_DIR).glob("step-*")):
        step = _step_of(candidate.name)
        if step is None or not candidate.is_dir():
            continue
        marker = candidate / COMPLETE_NAME
        try:
            flushed = read_complete(marker)
        except FileNotFoundError:
            skipped.append(Skipped(str(candidate), f"no {COMPLETE_NAME} (not every node's part flushed yet)"))
            continue
        except (OSError, RecordError) as exc:
            skipped.append(Skipped(str(candidate), f"{COMPLETE_NAME} cannot be read: {one_line(str(exc))[:200]}"))
            continue
        if flushed.step != step:
            skipped.append(Skipped(str(candidate), f"{COMPLETE_NAME} names step {flushed.step}"))
            continue
        good.append(Checkpoint(str(candidate), step, "tiers", _mtime_ns(marker) / 1e9, flushed.save_seconds))
    return good, skipped


VALIDATORS: dict[str, Callable[[Path], tuple[list[Checkpoint], list[Skipped]]]] = {
    "manifest": _manifest, "dcp": _dcp, "megatron": _megatron, "hf": hf_checkpoints,
    "lightning": lightning_checkpoints, "deepspeed": deepspeed_checkpoints, "tiers": _tiers,
}


def find_checkpoints(directory: Path, validator: str = "auto") -> tuple[list[Checkpoint], list[Skipped]]:
    """Every complete checkpoint (oldest step first) and every skipped candidate."""
    if not directory.is_dir():
        return [], []
    names = [n for n in VALIDATORS if n != "tiers"] if validator == "auto" else [validator]
    good: list[Checkpoint] = []
    skipped: list[Skipped] = []
    for name in names:
        found, bad = VALIDATORS[name](directory)
        good += found
        skipped += bad
    good.sort(key=lambda c: (c.step, c.path))
    return good, sorted(skipped, key=lambda s: s.path)


def latest_complete(directory: Path, validator: str = "auto") -> tuple[Checkpoint | None, list[Skipped]]:
    """The newest complete checkpoint, and the newer candidates that were skipped on the way."""
    good, skipped = find_checkpoints(directory, validator)
    best = good[-1] if good else None
    if best is None:
        return None, skipped
    newer = [s for s in skipped if (_step_of(Path(s.path).name) or -1) > best.step]
    return best, newer


def resume_point(directory: str | None, validator: str, say: Callable[[str], None]) -> Checkpoint | None:
    """The checkpoint a restart resumes from: the newest complete one in `directory` (None when the
    spec names no checkpoint directory), saying which newer candidates were skipped and why."""
    if not directory:
        return None
    best, skipped = latest_complete(Path(directory), validator)
    for item in skipped:
        say(f"skipping checkpoint {item.path}: {item.why}")
    return best


MAX_MARKED = 16
"""Candidates newer than the newest complete checkpoint that `markers` names (the newest of them)."""


def markers(directory: Path, validator: str = "auto", above: int | None = None) -> list[tuple[Path, int | None]]:
    """What to stat to learn that a checkpoint newer than step `above` may have become complete, without reading
    one: each path with its step (None for a path that is not one checkpoint's).  The folder the validator lists
    (a checkpoint renamed into place or a new candidate changes it: `tiers/` with tiers), every candidate in it
    of a step above `above` (its marker lands inside it: manifest.json, .metadata, complete.json; the newest
    MAX_MARKED), and Megatron's and DeepSpeed's tracker files.  One listing of that folder; nothing below it is read."""
    listed = directory / TIERS_DIR if validator == "tiers" else directory
    found: list[tuple[Path, int | None]] = [(listed, None)]
    if validator in ("auto", "megatron"):
        found.append((directory / "latest_checkpointed_iteration.txt", None))
    if validator in ("auto", "deepspeed"):
        found.append((directory / DEEPSPEED_LATEST, None))
    if validator in ("megatron", "deepspeed"):
        return found
    try:
        entries = list(os.scandir(listed))
    except OSError:
        return found
    newer = []
    for entry in entries:
        step = _step_of(entry.name)
        if step is None or entry.name.startswith(".") or (above is not None and step <= above):
            continue
        if validator == "tiers" and not entry.name.startswith("step-"):
            continue
        newer.append((step, entry.name))
    return found + [(listed / name, step) for step, name in sorted(newer)[-MAX_MARKED:]]
