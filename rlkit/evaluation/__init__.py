"""Evaluation: accuracy, mean@k, the unbiased pass@k estimator with intervals over problems,
paired comparisons of two models, and the eval harness."""

from rlkit.evaluation.comparison import ModelComparison, compare_reports
from rlkit.evaluation.eval_report import EvalReport, ProblemResult, read_jsonl
from rlkit.evaluation.evaluator import check_sampling, evaluate
from rlkit.evaluation.loaded_weights import LoadedModelWeights
from rlkit.evaluation.rescoring import rescore_records
from rlkit.metrics.pass_at_k import mean_and_pass_at_k, pass_at_k

__all__ = [
    "EvalReport",
    "LoadedModelWeights",
    "ModelComparison",
    "ProblemResult",
    "check_sampling",
    "compare_reports",
    "evaluate",
    "mean_and_pass_at_k",
    "pass_at_k",
    "read_jsonl",
    "rescore_records",
]
