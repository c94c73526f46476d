"""Golden files: compare rendered text with tests/data/golden/...; UPDATE_GOLDEN=1 rewrites them."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN_ROOT = Path(__file__).resolve().parent / "data" / "golden"


def assert_golden(relative: str, text: str) -> None:
    """`text` must equal the golden file (regenerate with UPDATE_GOLDEN=1 when a change is intended)."""
    path = GOLDEN_ROOT / relative
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{relative} differs; regenerate with UPDATE_GOLDEN=1 if the change is intended"
