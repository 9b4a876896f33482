"""Process-group helpers shared by the trainer and the rollout engines (identity with one process)."""
