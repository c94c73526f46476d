"""clusterctl: keep large GPU training jobs running on Slurm.

The shared core lives here (errors, files, the Slurm door, the records that pass between
processes); the parts are subpackages mapped from the repository's top-level folders:
`clusterctl.launcher` (launcher/), `clusterctl.healthd` (healthd/), `clusterctl.prolog`
(prolog/), `clusterctl.epilog` (epilog/) and the built-in `clusterctl.sbatch_templates`.
"""

__version__ = "0.2.0"


def package_version() -> str:
    """The installed distribution's version (importlib.metadata: what pip installed), else `__version__`
    (a checkout run without installing); what every command's --version says."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clusterctl")
    except PackageNotFoundError:
        return __version__
