"""healthd: the GPU node health daemon."""
