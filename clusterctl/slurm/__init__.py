"""The one door to Slurm both sides share: running its commands, parsing their output, hostlists, topology."""
