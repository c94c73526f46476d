"""Slurm Epilog hook."""
