"""The Slurm drain reason healthd writes and the supervisor reads back: one format, owned by its prefix."""

from __future__ import annotations

REASON_PREFIX = "healthd:"
"""Every drain healthd (or a hook) makes starts with this; a reason without it is an admin's."""
