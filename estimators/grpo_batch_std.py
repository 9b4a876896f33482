"""GRPO with TRL's batch-level scaling: group mean as baseline, one std for the whole batch.

TRL's ``GRPOConfig(scale_rewards="batch")``, recommended by "Tricks or Traps?
A Deep Dive into RL for LLM Reasoning" (arXiv:2508.08221): centring within the
group keeps the prompt-wise baseline, while a single batch-wide std avoids
blowing up groups that happen to agree closely.
"""

from __future__ import annotations

from typing import Any

import torch

from estimators.group_stats import safe_divide
from estimators.input_checks import check_epsilon, prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


def batch_std(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Unbiased std of the valid rows' scores (a 0-d tensor); 0 with fewer than two."""
    weight = valid.to(scores.dtype)
    count = weight.sum()
    mean = torch.dot(scores, weight) / count.clamp(min=1)
    centred = (scores - mean) * weight
    return (torch.dot(centred, centred) / (count - 1).clamp(min=1)).sqrt()


@ESTIMATORS.register(
    "grpo_batch_std",
    paper="arXiv:2508.08221",
    summary="(score - group mean) / (batch std + eps), TRL 'batch'",
    properties=("group_zero_sum", "reward_scale_invariant", "reward_shift_invariant"),
)
@torch.no_grad()
def grpo_batch_std(
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
    """Group-centred score scaled by the batch std: A_i = (s_i - mean_g) / (std_batch + epsilon).

    s_i = sum_t r_{i,t} m_{i,t}; mean_g is the mean of the group (rows sharing
    ``index``); std_batch the unbiased std of all non-empty responses' scores in
    the batch. This is TRL's ``scale_rewards="batch"`` (arXiv:2508.08221).

    Differences from TRL: TRL adds 1e-4 to the std (pass ``epsilon=1e-4`` for
    its numbers) and assumes contiguous groups of equal size; here groups come
    from ``index``. TRL takes the std over the whole gathered batch, so call
    this on the full batch, not per micro-batch or rank.

    Property kit (``rlkit.testing``): declares ``group_zero_sum``, ``reward_scale_invariant``
    (at epsilon = 0) and ``reward_shift_invariant`` (a common shift; per-group
    shifts change the batch std).

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: divide by (std_batch + epsilon); False leaves s_i - mean_g
            (then equal to ``dr_grpo``).
        epsilon: added to the batch std.
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) A_i on valid tokens, 0 on mask-0 tokens.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes; epsilon < 0.
        TypeError: an unknown option.

    A group with one non-empty response gets 0; a batch of equal scores gets 0;
    empty responses get 0 and are left out of both the group means and the
    batch std.
    """
    reject_unknown_options("grpo_batch_std", options)
    check_epsilon("grpo_batch_std", epsilon)
    batch = prepare_batch("grpo_batch_std", token_level_rewards, response_mask)
    scores, _, stats = outcome_group_stats("grpo_batch_std", batch, index)
    scalars = stats.centred
    if norm_by_std:
        scalars = safe_divide(scalars, batch_std(scores, stats.valid) + epsilon)
    advantages = spread_over_tokens(scalars, batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
