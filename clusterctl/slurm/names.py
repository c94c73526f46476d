"""What a Slurm job id and a node name may look like before either reaches a command's argv.

Job ids and node names are read back from files other processes wrote (the run journal,
rank maps) and from Slurm's own answers; a value that does not look like one (`-1`, `--help`,
`١٢`, `a b`) is refused here instead of becoming an option of scancel, sacct or sbatch.
"""

from __future__ import annotations

import re

JOB_ID = re.compile(r"[0-9]{1,18}")
"""A plain job id in ASCII digits (not an array or het-job spelling: clusterctl submits neither)."""

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
"""A node name as Slurm's NodeName= allows it in practice: no blank, comma, bracket or leading dash."""


def is_job_id(text: str) -> bool:
    """`text` is a plain Slurm job id (ASCII digits)."""
    return JOB_ID.fullmatch(text) is not None


def is_node_name(text: str) -> bool:
    """`text` is one node name that cannot be read as an option or a hostlist."""
    return NODE_NAME.fullmatch(text) is not None


def job_id_problem(text: object) -> str | None:
    """Why `text` is not a job id to put in an argv, or None when it is one."""
    if not isinstance(text, str) or not is_job_id(text):
        return f"{text!r} is not a Slurm job id (ASCII digits only)"
    return None


def node_name_problem(text: object) -> str | None:
    """Why `text` is not a node name to put in an argv, or None when it is one."""
    if not isinstance(text, str) or not is_node_name(text):
        return f"{text!r} is not a node name (letters, digits, '.', '_', '-'; not starting with '-')"
    return None
