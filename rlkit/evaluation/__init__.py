"""Evaluation: accuracy, mean@k, the unbiased pass@k estimator and the eval harness."""

from rlkit.evaluation.eval_report import EvalReport, ProblemResult, read_jsonl
from rlkit.evaluation.evaluator import check_sampling, evaluate
from rlkit.evaluation.loaded_weights import LoadedModelWeights
from rlkit.evaluation.rescoring import rescore_records
from rlkit.metrics.pass_at_k import mean_and_pass_at_k, pass_at_k

__all__ = [
    "EvalReport",
    "LoadedModelWeights",
    "ProblemResult",
    "check_sampling",
    "evaluate",
    "mean_and_pass_at_k",
    "pass_at_k",
    "read_jsonl",
    "rescore_records",
]
