"""clusterctl's built-in sbatch templates, shipped in the wheel as package data (read with importlib.resources)."""
