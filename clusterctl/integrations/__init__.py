"""clusterctl inside the training frameworks' own loops: callbacks that report each rank's progress
(clusterctl.progress.beat) with the loss and tokens, and mark checkpoint saves and loads.

- `clusterctl.integrations.lightning.ClusterctlCallback`: a Lightning `Callback`;
- `clusterctl.integrations.transformers.ClusterctlCallback`: a Hugging Face `TrainerCallback`.

Each module imports its framework, which clusterctl's base install does not bring: install the
`frameworks` extra (or the framework itself).  Importing this package imports neither.
"""

from __future__ import annotations

from clusterctl.integrations.beats import FrameworkMissing

__all__ = ["FrameworkMissing"]
