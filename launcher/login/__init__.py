"""On the login node: the `clusterctl` command, submit, the supervisor, status and report."""
