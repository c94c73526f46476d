"""Multi-level checkpoints for the training program (issue #25; see docs/checkpoint-tiers.md)."""
