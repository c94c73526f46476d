"""Inside the job, on the allocation's nodes: `python -m clusterctl.launcher.job` (plan, rank, node, agent)."""
