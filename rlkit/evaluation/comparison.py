"""Two models evaluated on the same problems: paired differences of accuracy and pass@k.

The unit is the problem. For each problem, model A's value (its fraction of correct
responses, or its unbiased pass@k) minus model B's is one paired difference; the mean
difference gets a t interval and the paired t-test's two-sided p-value
(:func:`rlkit.metrics.intervals.paired_t_test`). Pairing removes the spread due to
problem difficulty, which both models share, so it detects smaller differences than
two separate intervals would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.evaluation.eval_report import EvalReport
from rlkit.metrics.intervals import (
    LEVEL,
    PairedTest,
    paired_t_test,
    per_problem_mean,
    per_problem_pass_at_k,
)


@dataclass
class ModelComparison:
    """``model - baseline`` per metric, paired over problems.

    Attributes:
        model, baseline: the two models' names (their directories).
        num_problems: the number of paired problems.
        tests: ``accuracy`` and each ``pass@k`` both evaluations report -> the paired test.
        means: the same keys -> ``(model's mean, baseline's mean)``.
    """

    model: str
    baseline: str
    num_problems: int
    tests: dict[str, PairedTest]
    means: dict[str, tuple[float, float]]

    def table(self) -> str:
        """A Markdown table: metric, both means, difference, 95% interval, p, reading."""
        lines = [
            "| metric | model | baseline | difference | 95% interval | p (paired t) | reading |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, test in self.tests.items():
            a, b = self.means[name]
            d = test.difference
            p = "-" if test.p_value is None else f"{test.p_value:.3g}"
            lines.append(
                f"| {name} | {a:.4f} | {b:.4f} | {d.mean:+.4f} | {d.interval_text()} | {p} "
                f"| {test.verdict} |"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "baseline": self.baseline,
            "num_problems": self.num_problems,
            "unit": "problem",
            "metrics": {
                name: {"model": self.means[name][0], "baseline": self.means[name][1]}
                | test.to_json()
                for name, test in self.tests.items()
            },
        }


def _check_same_problems(model: EvalReport, baseline: EvalReport) -> None:
    ids_a = [p.id for p in model.problems]
    ids_b = [p.id for p in baseline.problems]
    if ids_a != ids_b:
        only = sorted(set(ids_a) ^ set(ids_b))[:5]
        raise ValueError(
            f"the two evaluations cover different problems ({len(ids_a)} and {len(ids_b)}"
            + (f"; e.g. {only} in one only" if only else "; in another order")
            + "): a paired comparison needs the same problems"
        )


def compare_reports(
    model: EvalReport,
    baseline: EvalReport,
    *,
    names: tuple[str, str] = ("model", "baseline"),
    level: float = LEVEL,
) -> ModelComparison:
    """Pair two evaluations problem by problem (same ids, same order).

    Args:
        model, baseline: the evaluations; differences are ``model - baseline``.
        names: how the two are named in the table and the JSON.
        level: the confidence level of the intervals.

    Raises:
        ValueError: the evaluations do not cover the same problems in the same order.
    """
    _check_same_problems(model, baseline)
    a = [p.correct for p in model.problems]
    b = [p.correct for p in baseline.problems]
    values = {"accuracy": (per_problem_mean(a), per_problem_mean(b))}
    for k in sorted(set(model.pass_ks) & set(baseline.pass_ks)):
        values[f"pass@{k}"] = (per_problem_pass_at_k(a, k), per_problem_pass_at_k(b, k))
    tests = {name: paired_t_test(x, y, level) for name, (x, y) in values.items()}
    means = {name: (sum(x) / len(x), sum(y) / len(y)) for name, (x, y) in values.items()}
    return ModelComparison(names[0], names[1], len(a), tests, means)
