"""Metric math with no dependencies on the rest of rlkit (pass@k); used by evaluation and the trainer."""
