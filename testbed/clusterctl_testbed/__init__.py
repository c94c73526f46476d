"""A real multi-host Slurm testbed with emulated GPUs, on one machine."""
