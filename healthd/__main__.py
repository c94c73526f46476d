"""`python -m clusterctl.healthd ...`: the `healthd` command by module name, for callers that know
a Python but not where its scripts are (the launcher's one-off `healthd evidence` step)."""

from clusterctl.healthd.cli import main

main()
