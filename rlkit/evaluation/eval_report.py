"""What an evaluation produced: per-problem results, summary metrics with their 95%
intervals over problems, their files and table."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlkit.metrics.intervals import LEVEL, Estimate, mean_at_n_interval, pass_at_k_interval


@dataclass
class ProblemResult:
    """One problem's ``n`` responses and how they scored.

    Attributes:
        id: the problem's id in the dataset.
        data_source: the dataset it came from (``gsm8k``, ``math500``, ...).
        question: the content of the prompt's last user message.
        prompt: the rendered text the model was given.
        ground_truth: the reference answer.
        responses: the ``n`` decoded responses.
        scores: the reward of each response.
        correct: whether each response is correct (the reward's ``acc`` field,
            else ``score > 0``, as in the trainer).
        finish_reasons: ``"stop"`` or ``"length"`` per response.
        response_lengths: generated tokens per response.
        reward_infos: the reward's extra fields per response (e.g. the parsed answer).
    """

    id: str
    data_source: str
    question: str
    prompt: str
    ground_truth: str
    responses: list[str]
    scores: list[float]
    correct: list[bool]
    finish_reasons: list[str]
    response_lengths: list[int]
    reward_infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_correct(self) -> int:
        return sum(self.correct)

    def to_json(self) -> dict[str, Any]:
        """The JSON Lines record: every attribute plus ``num_correct``."""
        return {**asdict(self), "num_correct": self.num_correct}


@dataclass
class EvalReport:
    """The result of :func:`rlkit.evaluation.evaluate`.

    Attributes:
        problems: one :class:`ProblemResult` per problem, in dataset order.
        metrics: ``accuracy`` (= ``mean@n``), ``mean@n``, ``pass@k`` for each k,
            ``score/mean``, ``response_length/mean``, ``response_length/clip_ratio``
            (fraction of responses cut at ``max_new_tokens``), ``reward/num_errors``,
            ``reward/num_timeouts``, ``timing_s/generate``, ``timing_s/score``,
            ``timing_s/total``, ``num_problems`` and ``n``.
        settings: how the evaluation was run (sampling, reward, dataset, model, ...).
    """

    problems: list[ProblemResult]
    metrics: dict[str, float]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.metrics["accuracy"]

    @property
    def pass_ks(self) -> list[int]:
        """The k of every ``pass@k`` in :attr:`metrics`, ascending."""
        return sorted(int(k.split("@")[1]) for k in self.metrics if k.startswith("pass@"))

    def intervals(self, level: float = LEVEL) -> dict[str, Estimate]:
        """``accuracy`` (= mean@n) and each ``pass@k`` with its interval over problems.

        The unit is the problem: each contributes its fraction of correct responses
        (mean@n) or its unbiased pass@k, and the interval is that of their mean (Wilson
        when every problem's value is 0 or 1, else t; see
        :func:`rlkit.metrics.intervals.proportion_interval`). Empty without problems.
        """
        correct = [p.correct for p in self.problems]
        if not correct:
            return {}
        out = {"accuracy": mean_at_n_interval(correct, level)}
        out |= {f"pass@{k}": pass_at_k_interval(correct, k, level) for k in self.pass_ks}
        return out

    def write_jsonl(self, path: str | Path) -> Path:
        """Write one JSON record per problem to ``path`` (atomically) and the summary
        (metrics, their :meth:`intervals`, settings) to ``<path without suffix>.summary.json``.

        Returns:
            The JSON Lines path.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in self.problems)
        _write_atomic(path, lines)
        intervals = {name: est.to_json() for name, est in self.intervals().items()}
        summary = {"metrics": self.metrics, "intervals": intervals, "settings": self.settings}
        _write_atomic(summary_path(path), json.dumps(summary, indent=2, default=str) + "\n")
        return path

    def summary_table(self) -> str:
        """A Markdown table of the headline metrics (accuracy, pass@k, lengths, errors, time),
        with the 95% interval over problems of accuracy and each pass@k."""
        m, n = self.metrics, int(self.metrics["n"])
        ci = self.intervals()
        rows = [
            ("problems", f"{int(m['num_problems'])}", ""),
            ("samples per problem (n)", f"{n}", ""),
        ]
        rows.append((f"accuracy (mean@{n})", f"{m['accuracy']:.4f}", _interval(ci["accuracy"])))
        rows += [
            (f"pass@{k}", f"{m[f'pass@{k}']:.4f}", _interval(ci[f"pass@{k}"])) for k in self.pass_ks
        ]
        rows += [
            ("score/mean", f"{m['score/mean']:.4f}", ""),
            ("response length (mean tokens)", f"{m['response_length/mean']:.1f}", ""),
            ("cut at max_new_tokens", f"{m['response_length/clip_ratio']:.3f}", ""),
            (
                "reward errors / timeouts",
                f"{int(m['reward/num_errors'])} / {int(m['reward/num_timeouts'])}",
                "",
            ),
            ("wall time (s)", f"{m['timing_s/total']:.1f}", ""),
        ]
        width = max(len(name) for name, _, _ in rows)
        lines = [
            f"| {'metric':<{width}} | value | 95% interval (over problems) |",
            f"|{'-' * (width + 2)}|-------|---|",
        ]
        lines += [f"| {name:<{width}} | {value} | {ci_text} |" for name, value, ci_text in rows]
        return "\n".join(lines)


def _interval(est: Estimate) -> str:
    return f"{est.interval_text()} ({est.method})" if est.has_interval else est.interval_text()


def summary_path(jsonl_path: str | Path) -> Path:
    """Where :meth:`EvalReport.write_jsonl` puts the summary next to ``jsonl_path``."""
    path = Path(jsonl_path)
    return path.with_name(path.stem + ".summary.json")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The per-problem records of a file written by :meth:`EvalReport.write_jsonl`."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _write_atomic(path: Path, text: str) -> None:
    # A killed evaluation must not leave a half-written file that looks complete.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
