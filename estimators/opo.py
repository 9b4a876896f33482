"""OPO: on-policy RL with the length-weighted mean score of the group as baseline."""

from __future__ import annotations

from typing import Any

import torch

from estimators.group_stats import group_sum
from estimators.input_checks import prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "opo",
    paper="arXiv:2505.23585",
    summary="score - the group's length-weighted mean score",
    properties=(
        "group_token_zero_sum",
        "reward_shift_invariant",
        "group_shift_invariant",
        "group_local",
    ),
)
@torch.no_grad()
def opo(
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
    """OPO advantage: A_i = s_i - b_g with b_g = sum_j |y_j| s_j / sum_j |y_j| over the group.

    "On-Policy RL with Optimal Reward Baseline" (arXiv:2505.23585): under
    sequence-level loss aggregation the variance-minimising baseline weights
    each response's score by its length |y_j| (its number of valid tokens).
    s_i = sum_t r_{i,t} m_{i,t}; the group is the rows sharing ``index``.

    Degenerate inputs: a group with one non-empty response gets 0 (verl: the
    raw score s_i, from a baseline of 0). Empty responses get 0; their length
    is 0, so they would not move b_g anyway.

    Property kit (``rlkit.testing``): declares ``group_token_zero_sum`` (length-weighted:
    sum_i |y_i| A_i = 0), ``reward_shift_invariant``, ``group_shift_invariant`` and
    ``group_local``.

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: ignored (OPO does not scale).
        epsilon: ignored.
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) A_i on valid tokens, 0 on mask-0 tokens.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes.
        TypeError: an unknown option.
    """
    reject_unknown_options("opo", options)
    batch = prepare_batch("opo", token_level_rewards, response_mask)
    _, lengths, stats = outcome_group_stats("opo", batch, index)
    ids, groups = stats.group_ids, stats.num_groups
    # Work on the group-centred scores: the baseline shifts with them, and equal
    # scores then give exactly 0 instead of a rounding residue.
    weighted = group_sum(stats.centred * lengths, ids, groups)
    total_length = group_sum(lengths, ids, groups).clamp(min=1)
    # A singleton's centred score is exactly 0, and so is its baseline.
    scalars = stats.centred - (weighted / total_length)[ids]
    advantages = spread_over_tokens(scalars, batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
