"""Evaluation: accuracy, mean@k and the unbiased pass@k estimator."""

from rlkit.evaluation.pass_at_k import mean_and_pass_at_k, pass_at_k

__all__ = ["mean_and_pass_at_k", "pass_at_k"]
