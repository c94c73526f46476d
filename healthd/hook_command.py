"""The command line of the Slurm hooks (`clusterctl-prolog`, `clusterctl-epilog`): slurmd runs them with
no arguments inside a job; a person who runs one by hand gets its help, its version or a refusal, never
the hook itself (a prolog run by hand as root could drain the node)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from clusterctl import package_version

EXIT_NOT_IN_A_JOB = 2
"""A hook run outside a Slurm job (no SLURM_JOB_ID): nothing was done (argparse's usage error code too)."""


def hook_main(hook: str, slurm_conf: str, about: str, run: Callable[[dict[str, str]], int], *,
              argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Parse `argv` (--help, --version and nothing else), then `run` the hook on `environ` when it runs
    inside a Slurm job; else EXIT_NOT_IN_A_JOB with one message saying how the hook is meant to be called.

    `hook` is its name without the `clusterctl-` prefix; `slurm_conf` the slurm.conf key(s) that install it
    (`Prolog` or `Epilog`, with any companion line); `about` its one-paragraph description."""
    environ = dict(os.environ if environ is None else environ)
    program = f"clusterctl-{hook}"
    where = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else f"/path/to/{program}"
    how = f"slurmd runs it (as root, no arguments) for each job; install it in slurm.conf: {slurm_conf.format(path=where)}"
    parser = argparse.ArgumentParser(prog=program, description=about,
                                     epilog=f"{how}. Exit 2 when run outside a Slurm job (no SLURM_JOB_ID): "
                                            "nothing is done.")
    parser.add_argument("--version", action="version", version=f"%(prog)s (clusterctl {package_version()})")
    parser.parse_args(argv)
    if not environ.get("SLURM_JOB_ID"):
        print(f"{program}: not inside a Slurm job (no SLURM_JOB_ID): nothing done. {how}", file=sys.stderr)
        return EXIT_NOT_IN_A_JOB
    return run(environ)
