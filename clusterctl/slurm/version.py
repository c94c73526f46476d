"""Which Slurm answers, and what that release offers: asked once per process, never assumed.

Facts relied on (SchedMD's release notes and data_parser plugins, measured on Debian's 22.05.8,
24.11.5 and 26.05.5 and recorded from SchedMD's 23.02.8, 23.11.11, 24.05.8 and 25.11.7;
../shared/notes/slurm-versions.md):
- `--json` output families: 22.05 prints openapi v0.0.38 shapes, 23.02 v0.0.39 (named in
  `meta.plugins.data_parser`, `plugins` plural; states still strings, squeue's exit code still a
  wait status), 23.11 and later v0.0.40 … v0.0.45 (states become lists, times and exit codes
  objects).  clusterctl.slurm.jobs has the table, field by field.
- squeue honours its filters with `--json` only from 24.05.1, and from then hides finished jobs
  unless `-t all`.
- `scontrol show node N --json` exists from 23.02; `squeue --only-job-state` from 24.05.
- sacct's JSON exit code of a failed job reads SUCCESS/0 on 22.05 and 23.02 (a dumper bug).
- `--segment` from 24.05; topology/block from 23.11; topology.yaml from 25.05.
- From 25.11 (checked in SchedMD's source, tags slurm-25-05-8-1 and slurm-25-11-7-1): `sbatch
  --requeue=expedite`; `HealthCheckNodeState=START_ONLY`; squeue shows a job's SLUID (`%s`).
- From 26.05 (tag slurm-26-05-3-1): a step's tasks follow the topology's order unless the user names a
  distribution (`SelectTypeParameters=CR_NO_DIST_TOPO_BLOCK` turns it off).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.errors import SlurmCommandError

OLDEST_SUPPORTED = (22, 5)
"""Older releases are refused with a clear error rather than misread."""

_VERSION = re.compile(r"^(?:slurm(?:-wlm)?\s+)?(\d{2})\.(\d{2})\.(\d+)(?:[-.]\S*)?$")


class SlurmVersionError(SlurmCommandError):
    """Slurm answered with a release or an output shape this clusterctl does not know (exit 8)."""

    def __init__(self, command: list[str], message: str) -> None:
        super().__init__(command, 0, message)
        # The command succeeded; what failed is reading its answer, so say that, not "exited with 0".
        self.args = (f"`{' '.join(command)}`: {message}",)


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release, e.g. 24.11.5, with what clusterctl relies on it offering."""

    major: int
    minor: int
    micro: int

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"

    def at_least(self, major: int, minor: int, micro: int = 0) -> bool:
        """This release is the given one or newer."""
        return (self.major, self.minor, self.micro) >= (major, minor, micro)

    @property
    def json_family(self) -> str:
        """The `--json` output family: `v0.0.38` (22.05), `v0.0.39` (23.02) or `v0.0.40+`."""
        if not self.at_least(23, 2):
            return "v0.0.38"
        if not self.at_least(23, 11):
            return "v0.0.39"
        return "v0.0.40+"

    @property
    def squeue_json_filters(self) -> bool:
        """`squeue --json` honours -j/-u/-t (and hides finished jobs unless `-t all`)."""
        return self.at_least(24, 5, 1)

    @property
    def scontrol_node_json(self) -> bool:
        """`scontrol show node N --json` exists."""
        return self.at_least(23, 2)

    @property
    def only_job_state(self) -> bool:
        """`squeue --only-job-state` (a cheap job-state-only RPC) exists."""
        return self.at_least(24, 5)

    @property
    def sacct_exit_code_trustworthy(self) -> bool:
        """sacct's JSON reports a failed job's real exit code (not SUCCESS/0)."""
        return self.at_least(23, 11)

    @property
    def segment(self) -> bool:
        """sbatch accepts `--segment`."""
        return self.at_least(24, 5)

    @property
    def topology_block(self) -> bool:
        """The topology/block plugin exists."""
        return self.at_least(23, 11)

    @property
    def topology_yaml(self) -> bool:
        """topology.yaml is read (and topology.conf ignored when it exists)."""
        return self.at_least(25, 5)

    @property
    def expedited_requeue(self) -> bool:
        """sbatch takes `--requeue=expedite`: after a node failure (or a failed epilog following a non-zero
        exit) the job requeues at once as the highest-priority job, and its nodes run no other work first.

        SchedMD's RELEASE_NOTES.md of 25.11 ("Expedited Requeue"); src/common/slurm_opt.c
        `arg_set_requeue`: exactly `expedite` (25.11.0's own help and man page said `expedited`, which
        is a plain `--requeue`); up to 25.05.8 `--requeue` takes no value at all."""
        return self.at_least(25, 11)

    @property
    def health_check_start_only(self) -> bool:
        """`HealthCheckNodeState=START_ONLY`: HealthCheckProgram runs only when slurmd starts.

        SchedMD's CHANGELOG/slurm-25.11.md (25.11.0rc1: "Add HealthCheckNodeState=START_ONLY option");
        src/common/read_config.c reads it from 25.11.0, not in 25.05.8 (26.05 adds `REBOOT_ONLY`)."""
        return self.at_least(25, 11)

    @property
    def sluid(self) -> bool:
        """squeue shows a job's SLUID, the unique id of one run of a job (`squeue -o %s`, `--Format=SLUID`;
        also sbatch's `%S` file name pattern and SLURM_JOB_SLUID in the prolog's and epilog's environment).

        src/squeue/opts.c of 25.11.0 (`{"SLUID", 's', ...}`; 25.05.8's squeue calls `%s` an invalid
        format) and CHANGELOG/slurm-25.11.md (25.11.0rc2: `%S`, SLURM_JOB_SLUID).  Only accounting had
        it before: sacct's `SLUID` field from 24.11 (src/sacct/sacct.c); 26.05 accepts a SLUID wherever
        a job id goes."""
        return self.at_least(25, 11)

    @property
    def topology_ordered_steps(self) -> bool:
        """A step's tasks and nodes follow the topology's order by default when a topology plugin is
        configured and the user names no distribution; `SelectTypeParameters=CR_NO_DIST_TOPO_BLOCK`
        turns it off.  (clusterctl's rank steps name `--distribution=arbitrary`: their placement is the
        rank map's either way.)

        SchedMD's CHANGELOG/slurm-26.05.md (26.05.0rc1: "Add topology-aware task distribution for
        steps"); doc/man/man5/slurm.conf.5 and srun.1's `--distribution`; src/common/read_config.c
        reads CR_NO_DIST_TOPO_BLOCK from 26.05.0, not in 25.11.7."""
        return self.at_least(26, 5)


def parse_version(text: str, command: list[str] | None = None) -> SlurmVersion:
    """`sinfo --version` style text (`slurm 24.11.5`, `slurm-wlm 22.05.8`) → SlurmVersion.

    Raises SlurmVersionError for text that is not a version or a release older than 22.05.
    """
    argv = command or ["sinfo", "--version"]
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    match = _VERSION.match(line)
    if not match:
        raise SlurmVersionError(argv, f"cannot read a Slurm version from {line[:80]!r}; "
                                      "expected e.g. `slurm 24.11.5`")
    version = SlurmVersion(int(match[1]), int(match[2]), int(match[3]))
    if (version.major, version.minor) < OLDEST_SUPPORTED:
        raise SlurmVersionError(argv, f"Slurm {version} is older than the oldest release clusterctl supports "
                                      f"({OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]:02d}); upgrade Slurm")
    return version
