"""Score saved responses again with another reward or reward options, without regenerating.

Generation is the expensive part of an evaluation; how answers are read is often
the question (GSM8K's strict ``####`` reading against the flexible last-number
reading, say). :func:`rescore_records` re-scores the ``responses`` of a file written
by :meth:`rlkit.evaluation.EvalReport.write_jsonl`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlkit.metrics.pass_at_k import mean_and_pass_at_k


def rescore_records(
    records: Sequence[Mapping[str, Any]],
    reward: str | Callable[..., Any],
    *,
    reward_options: Mapping[str, Any] | None = None,
    ks: Sequence[int] | None = None,
    timeout_s: float | None = 10.0,
) -> dict[str, float]:
    """Accuracy (mean@n) and pass@k of saved responses under ``reward``.

    Args:
        records: per-problem records with ``responses``, ``ground_truth`` and
            ``data_source`` (as :func:`rlkit.evaluation.eval_report.read_jsonl` returns).
        reward: a registered reward name, a ``"pkg.module:function"`` path or a callable.
        reward_options: extra keyword arguments of every reward call.
        ks: the k of pass@k (default 1, 2, 4, ..., n).
        timeout_s: time limit per reward call.

    Returns:
        ``{"accuracy", "mean@n", "pass@k"..., "score/mean", "reward/num_errors"}``.

    Raises:
        ValueError: no records, or records with different numbers of responses.
    """
    import rewards

    if not records:
        raise ValueError("no records to rescore")
    responses = [text for r in records for text in r["responses"]]
    truths = [str(r["ground_truth"]) for r in records for _ in r["responses"]]
    extras = [
        {**(reward_options or {}), "data_source": str(r.get("data_source") or "")}
        for r in records
        for _ in r["responses"]
    ]
    scored = rewards.score_batch(reward, responses, truths, extras, timeout_s=timeout_s)
    flags = [bool(i.get("acc", s > 0)) for s, i in zip(scored.scores, scored.infos)]
    sizes = [len(r["responses"]) for r in records]
    starts = [0, *itertools.accumulate(sizes)][:-1]
    stats = mean_and_pass_at_k([flags[s : s + n] for s, n in zip(starts, sizes)], ks)
    n = sizes[0]
    return {
        "accuracy": stats[f"mean@{n}"],
        **stats,
        "score/mean": sum(scored.scores) / len(scored.scores),
        "reward/num_errors": float(scored.num_errors),
    }
