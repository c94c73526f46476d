"""Slurm Prolog hook."""
