"""Code both the login node and the job run: the run directory, checkpoints, straggler actions."""
