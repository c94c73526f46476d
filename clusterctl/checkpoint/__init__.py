"""Multi-level checkpoints for the training program (issue #25; see docs/checkpoint-tiers.md).

`from clusterctl.checkpoint import Checkpointer` loads the API on first use: importing the package
costs nothing (a training program imports it before it knows whether it runs under clusterctl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterctl.checkpoint.api import Checkpointer, CheckpointSetupError, CopyTransport, Resume

__all__ = ["Checkpointer", "CheckpointSetupError", "CopyTransport", "Resume"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from clusterctl.checkpoint import api

        return getattr(api, name)
    raise AttributeError(f"module 'clusterctl.checkpoint' has no attribute {name!r}")
