"""Outcome-level estimators' shared steps: one score per response, group stats, broadcast back.

The score of a response is s = sum_t r_t * m_t. verl sums the rewards without
the mask; the two agree whenever rewards are zero on mask-0 tokens, which is
how reward managers place them (the outcome reward on the last valid token).
"""

from __future__ import annotations

from typing import Any

import torch

from estimators.group_stats import GroupStats, factorize_group_ids, group_statistics
from estimators.input_checks import TokenBatch


def sequence_scores(batch: TokenBatch) -> torch.Tensor:
    """(B,) s = sum_t r_t * m_t, the outcome score of each response."""
    return torch.linalg.vecdot(batch.rewards, batch.mask_f)


def spread_over_tokens(scalars: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """(B, T) each row's scalar on its valid tokens, 0 on mask-0 tokens."""
    return scalars[:, None] * batch.mask_f


def require_index(estimator: str, index: Any) -> Any:
    """Return ``index`` or raise the estimator's "needs index" error.

    Raises:
        ValueError: ``index`` is None.
    """
    if index is None:
        raise ValueError(
            f"{estimator} needs `index` (B,) group ids: one id per row, equal for the responses "
            f"sampled from the same prompt (e.g. verl's uid array); pass index=..."
        )
    return index


def outcome_group_stats(
    estimator: str, batch: TokenBatch, index: Any
) -> tuple[torch.Tensor, torch.Tensor, GroupStats]:
    """Scores, lengths and group statistics of a batch (empty rows excluded).

    Args:
        estimator: name used in error messages.
        batch: the validated inputs.
        index: (B,) group ids (tensor, numpy array or sequence of hashables).

    Returns:
        scores: (B,) outcome scores.
        lengths: (B,) valid-token counts.
        stats: group statistics over the non-empty rows.

    Raises:
        ValueError: ``index`` is missing or malformed.
    """
    require_index(estimator, index)
    try:
        group_ids, num_groups = factorize_group_ids(index, batch.batch_size, batch.rewards.device)
    except ValueError as exc:
        raise ValueError(f"{estimator}: {exc}") from exc
    scores = sequence_scores(batch)
    lengths = batch.lengths
    stats = group_statistics(scores, group_ids, num_groups, lengths > 0)
    return scores, lengths, stats
