"""Torch state dicts in a checkpoint copy: torch.distributed.checkpoint (DCP) with `no_dist=True`, one
folder per rank (`rank-<global rank>/`: DCP's shards and its own `.metadata`), so each rank writes
and reads only its own files and no collective runs inside a save.  torch is imported only here,
and only when called: the rest of clusterctl.checkpoint works without it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

_SINGLE_PROCESS = "torch.distributed is disabled, unavailable or uninitialized"


def save_rank_state(directory: Path, state_dict: dict[str, Any]) -> None:
    """Write `state_dict` (tensors, nested dicts, Stateful objects) into `directory` with DCP."""
    import torch.distributed.checkpoint as dcp

    directory.mkdir(mode=0o700, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS)  # no_dist says so: one rank, its own files
            dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(str(directory)), no_dist=True)
    except OSError:
        raise
    except Exception as exc:
        # DCP wraps a failed write (a full disk) in its own exception; an OSError keeps its meaning.
        cause = _os_error_in(exc)
        if cause is not None:
            raise cause from exc
        raise


def load_rank_state(directory: Path, state_dict: dict[str, Any]) -> None:
    """Load, in place, `state_dict` from `directory` (written by save_rank_state)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS)
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(str(directory)), no_dist=True)


def _os_error_in(exc: BaseException) -> OSError | None:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            if isinstance(failure, OSError):
                return failure
            if isinstance(failure, tuple) and failure and isinstance(failure[0], OSError):
                return failure[0]
    cause = exc.__cause__
    return cause if isinstance(cause, OSError) else None
