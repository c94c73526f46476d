"""The error families clusterctl reports, each with its own exit code.

Every message says what is wrong, where (file, line, key) and what to do; the CLI
prints it as one paragraph without a traceback (`--debug` shows one).
"""

from __future__ import annotations


class ClusterctlError(Exception):
    """Base of every error clusterctl reports to a user."""

    exit_code = 1


class HostlistError(ClusterctlError):
    """A Slurm hostlist expression that Slurm would reject too."""

    exit_code = 3


class TopologyError(ClusterctlError):
    """A topology source (topology.conf, `scontrol show topology`, address paths) that is malformed."""

    exit_code = 4

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None) -> None:
        where = f"{source}:{line}: " if source and line else f"{source}: " if source else ""
        super().__init__(f"{where}{message}")
        self.source, self.line = source, line


class LayoutError(ClusterctlError):
    """A parallel layout that cannot run on the GPUs given; the message names the number to change."""

    exit_code = 5


class PlacementError(ClusterctlError):
    """Nodes that do not fit the topology or the layout (unknown node, too few nodes)."""

    exit_code = 6


class SpecError(ClusterctlError):
    """A job spec value that is missing or wrong."""

    exit_code = 7

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        where = ", ".join(part for part in (path, f"key `{key}`" if key else None) if part)
        super().__init__(f"{where}: {message}" if where else message)
        self.path, self.key = path, key


class RunError(ClusterctlError):
    """A run directory that is missing, damaged, or held by another supervisor."""

    exit_code = 9


class OutputError(ClusterctlError):
    """A file or directory clusterctl was asked to write that cannot be written (--svg, --run-dir)."""

    exit_code = 12


INTERNAL_ERROR_EXIT = 70
"""What the command line exits with on an error no family covers (a bug): one line, `--debug` for more."""


class SlurmCommandError(ClusterctlError):
    """A Slurm command that failed or timed out; carries Slurm's own message."""

    exit_code = 8

    def __init__(self, argv: list[str], returncode: int | None, stderr: str) -> None:
        what = "timed out" if returncode is None else f"exited with {returncode}"
        super().__init__(f"`{' '.join(argv)}` {what}: {stderr.strip() or '(no message)'}")
        self.argv, self.returncode, self.stderr = argv, returncode, stderr

    @property
    def brief(self) -> str:
        """One line: the command and Slurm's last word (its `fatal:` line comes last), for a note that
        Slurm could not be asked, where the whole message would be several lines of its retries."""
        what = ("timed out" if self.returncode is None else "printed an error" if self.returncode == 0
                else f"exited with {self.returncode}")
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return f"`{' '.join(self.argv)}` {what}: {lines[-1] if lines else '(no message)'}"
