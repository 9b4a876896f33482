"""Pass@k GRPO: only the best response of each group is reinforced, by its margin over the runner-up."""

from __future__ import annotations

from typing import Any

import torch

from estimators.group_stats import group_reduce, safe_divide
from estimators.input_checks import check_epsilon, prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "grpo_passk",
    paper="arXiv:2503.19595",
    summary="best of group gets (best - runner-up) [/ group std]",
    properties=(
        "reward_scale_invariant",
        "reward_shift_invariant",
        "group_shift_invariant",
        "group_local",
    ),
)
@torch.no_grad()
def grpo_passk(
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
    """Pass@k advantage: A = s_max - s_second for the group's best response, 0 for the rest.

    "Optimizing Pass@k" style outcome advantage as implemented by verl
    (arXiv:2503.19595): with s_i = sum_t r_{i,t} m_{i,t}, the response with the
    highest score in its group (rows sharing ``index``) gets the margin over
    the second-highest score, divided by (std_g + epsilon) when
    ``norm_by_std``; every other response gets 0. Ties give 0 (margin 0).

    Degenerate inputs: a group with fewer than two non-empty responses gets 0
    (verl raises ValueError). Empty responses get 0 and are not candidates.
    Among tied best responses the first row is the one marked; its value is 0
    anyway.

    Property kit (``rlkit.testing``): declares ``reward_scale_invariant`` (at epsilon = 0),
    ``reward_shift_invariant``, ``group_shift_invariant`` and ``group_local``.

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: divide the margin by (std_g + epsilon), std_g unbiased
            (verl's ``norm_adv_by_std_in_grpo``).
        epsilon: added to the group std.
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) the margin on the best response's valid tokens, 0 elsewhere.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes; epsilon < 0.
        TypeError: an unknown option.
    """
    reject_unknown_options("grpo_passk", options)
    check_epsilon("grpo_passk", epsilon)
    batch = prepare_batch("grpo_passk", token_level_rewards, response_mask)
    scores, _, stats = outcome_group_stats("grpo_passk", batch, index)
    ids, groups, valid = stats.group_ids, stats.num_groups, stats.valid
    best = group_reduce(torch.where(valid, scores, -torch.inf), ids, groups, "amax", -torch.inf)
    rows = torch.arange(batch.batch_size, device=scores.device)
    is_best = valid & (scores == best[ids])
    no_row = batch.batch_size
    first_best = group_reduce(torch.where(is_best, rows, no_row), ids, groups, "amin", no_row)
    chosen = rows == first_best[ids]
    runner_up = group_reduce(
        torch.where(valid & ~chosen, scores, -torch.inf), ids, groups, "amax", -torch.inf
    )
    margin = torch.where(chosen & (stats.size >= 2), best[ids] - runner_up[ids], 0.0)
    if norm_by_std:
        margin = safe_divide(margin, stats.std + epsilon)
    advantages = spread_over_tokens(margin, batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
