"""healthd's state file: the current verdict per GPU, read instantly by status, prolog and health checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

STATE_NAME = "state.json"


def write_state(state_dir: Path, state: dict) -> None:
    """Replace the state file atomically (temp file + rename: readers never see half of it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_NAME}.{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, state_dir / STATE_NAME)


def read_state(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / STATE_NAME).read_text())
    except (OSError, ValueError):
        return None
