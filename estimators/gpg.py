"""GPG: group policy gradient, group-centred scores rescaled by the batch's share of non-zero scores."""

from __future__ import annotations

import math
from typing import Any

import torch

from estimators.input_checks import prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "gpg",
    paper="arXiv:2504.02546",
    summary="alpha * (score - group mean), alpha = B / #nonzero scores",
    properties=("group_zero_sum",),
)
@torch.no_grad()
def gpg(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG advantage: A_i = alpha * (s_i - mean_g) / f_norm with alpha = B / max(#{s_j != 0}, 1).

    "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning" (arXiv:2504.02546). s_i = sum_t r_{i,t} m_{i,t}; mean_g the mean
    of the group (rows sharing ``index``). alpha corrects the gradient estimate
    for the share of responses with a zero score (the paper's "accurate
    gradient estimation"), as verl computes it: B over the count of non-zero
    scores in the batch. No std division (verl computes the group std but does
    not use it).

    Degenerate inputs: a group with one non-empty response gets 0 (verl:
    alpha * s_i). Empty responses get 0 and count neither in B nor in the
    non-zero count, so appending them changes nothing.

    Property kit (``rlkit.testing``): declares ``group_zero_sum`` (alpha depends on the whole
    batch, so it is not ``group_local`` nor shift-invariant).

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: ignored (GPG does not divide by the std).
        epsilon: ignored.
        **options: ``f_norm`` (float > 0, default 1.0), the constant divisor of
            verl's implementation. Any other key raises TypeError.

    Returns:
        advantages: (B, T) A_i on valid tokens, 0 on mask-0 tokens.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes; f_norm <= 0.
        TypeError: an unknown option.
    """
    reject_unknown_options("gpg", options, known=("f_norm",))
    f_norm = options.get("f_norm", 1.0)
    if not (isinstance(f_norm, int | float) and math.isfinite(f_norm) and f_norm > 0):
        raise ValueError(f"gpg: f_norm must be a finite number > 0, got {f_norm!r}")
    batch = prepare_batch("gpg", token_level_rewards, response_mask)
    scores, _, stats = outcome_group_stats("gpg", batch, index)
    num_rows = stats.valid.sum()
    nonzero = (stats.valid & (scores != 0)).sum()
    alpha = num_rows.to(scores.dtype) / nonzero.clamp(min=1).to(scores.dtype)
    advantages = spread_over_tokens(stats.centred * (alpha / f_norm), batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
