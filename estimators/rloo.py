"""RLOO: REINFORCE with the leave-one-out mean of the other samples as baseline."""

from __future__ import annotations

from typing import Any

import torch

from estimators.input_checks import prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "rloo",
    aliases=("rloo_vectorized",),
    paper="arXiv:2402.14740",
    summary="score minus the mean score of the other responses",
    properties=("group_zero_sum", "reward_shift_invariant", "group_shift_invariant", "group_local"),
)
@torch.no_grad()
def rloo(
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
    """Leave-one-out advantage: A_i = s_i - mean_{j != i} s_j = (s_i - mean_g) * n / (n - 1).

    "Back to Basics: Revisiting REINFORCE Style Optimization" (arXiv:2402.14740).
    s_i = sum_t r_{i,t} m_{i,t}; n is the number of non-empty responses in the
    group (rows sharing ``index``). The second form is how it is computed: one
    group sum, no per-row exclusion.

    Degenerate inputs: a group with one non-empty response has no other sample
    to compare against and gets 0. verl's ``rloo`` keeps the raw score s_i
    there while its ``rloo_vectorized`` gives 0; this follows the latter.
    Empty responses get 0 and do not count in n.

    Property kit (``rlkit.testing``): declares ``group_zero_sum``, ``reward_shift_invariant``,
    ``group_shift_invariant`` and ``group_local``.

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: ignored (RLOO does not scale).
        epsilon: ignored.
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) A_i on valid tokens, 0 on mask-0 tokens.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes.
        TypeError: an unknown option.
    """
    reject_unknown_options("rloo", options)
    batch = prepare_batch("rloo", token_level_rewards, response_mask)
    _, _, stats = outcome_group_stats("rloo", batch, index)
    # centred is exactly 0 for singletons, so clamping n - 1 to 1 cannot leak a value.
    scalars = stats.centred * stats.size / (stats.size - 1).clamp(min=1)
    advantages = spread_over_tokens(scalars, batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
