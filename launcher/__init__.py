"""clusterctl's launcher, in four folders by where their code runs (docs/architecture.md):

- `pure/`: judgement with no side effects (spec, rank maps, scripts, failure classification,
  restart policy, hang and straggler watches, goodput); imports only the core.
- `shared/`: code both the login node and the job run (the run directory, checkpoints, the
  straggler actions).
- `job/`: inside the job, on the allocation's nodes (`python -m clusterctl.launcher.job`: the
  plan and rank steps, the in-allocation agent); never imports `login/`.
- `login/`: on the login node (the `clusterctl` command, submit, the supervisor, status, report).
"""
