"""GRPO and Dr.GRPO: group-relative outcome advantages.

For response i of a group g (the rows sharing ``index``) with outcome score
s_i = sum_t r_{i,t} m_{i,t}:

    GRPO     A_i = (s_i - mean_g) / (std_g + epsilon)    (std_g unbiased)
    Dr.GRPO  A_i =  s_i - mean_g

broadcast over the response's valid tokens. Returns equal the advantages.

Degenerate inputs (see :mod:`estimators`): a group with one non-empty response
gets 0 (verl uses mean 0, std 1 there, i.e. s / (1 + epsilon)); a group of equal
scores gets exactly 0; an empty response gets 0 and is left out of its group's
statistics (verl counts it, with its unmasked reward sum).

Same name, different meaning: ``grpo`` is this estimator in verl but a loss
aggregation in TRL; ``dr_grpo`` is a loss aggregation in TRL and these
mean-centred advantages in OpenRLHF. Group-norm epsilon: 1e-6 here and in verl,
1e-4 in TRL, 1e-9 in OpenRLHF (pass ``epsilon`` to match them).
"""

from __future__ import annotations

from typing import Any

import torch

from estimators.group_stats import GroupStats, safe_divide
from estimators.input_checks import check_epsilon, prepare_batch, reject_unknown_options
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


def group_relative_scalars(stats: GroupStats, norm_by_std: bool, epsilon: float) -> torch.Tensor:
    """(B,) s - mean_g, divided by (std_g + epsilon) when ``norm_by_std``; 0 where that is 0/0."""
    if not norm_by_std:
        return stats.centred
    return safe_divide(stats.centred, stats.std + epsilon)


@ESTIMATORS.register(
    "grpo",
    aliases=("grpo_vectorized",),
    paper="arXiv:2402.03300",
    summary="(score - group mean) / (group std + eps)",
    properties=(
        "group_zero_sum",
        "reward_scale_invariant",
        "reward_shift_invariant",
        "group_shift_invariant",
        "group_local",
    ),
)
@torch.no_grad()
def grpo(
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
    """GRPO outcome advantage: the score's z-value within its prompt's group.

    A_i = (s_i - mean_g) / (std_g + epsilon) with s_i = sum_t r_{i,t} m_{i,t} and
    the unbiased std over the group's non-empty responses (DeepSeekMath,
    arXiv:2402.03300). ``norm_by_std=False`` gives Dr.GRPO's A_i = s_i - mean_g
    (arXiv:2503.20783). Matches verl's ``grpo`` / ``grpo_vectorized`` on groups of
    size >= 2 with rewards zero on mask-0 tokens.

    Property kit (``rlkit.testing``): declares ``group_zero_sum``, ``reward_scale_invariant``
    (exactly, at epsilon = 0), ``reward_shift_invariant``, ``group_shift_invariant``
    and ``group_local``.

    Args:
        token_level_rewards: (B, T) rewards; the outcome reward usually sits on
            the last valid token.
        response_mask: (B, T) bool or 0/1, 1 on response tokens trained on.
        index: (B,) group ids (1-D tensor, numpy array or sequence of hashable
            ids such as uid strings). Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: divide by (std_g + epsilon) (GRPO); False = Dr.GRPO.
        epsilon: added to the group std (verl 1e-6; TRL 1e-4; OpenRLHF 1e-9).
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) A_i on valid tokens, 0 on mask-0 tokens, rewards' dtype.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or not B ids; bad shapes; epsilon < 0.
        TypeError: an unknown option.

    Degenerate groups give 0: a single non-empty response (verl: s / (1 + eps)),
    all scores equal (as verl). Empty responses give 0 and are left out of their
    group's mean and std (verl includes them).
    """
    reject_unknown_options("grpo", options)
    check_epsilon("grpo", epsilon)
    batch = prepare_batch("grpo", token_level_rewards, response_mask)
    _, _, stats = outcome_group_stats("grpo", batch, index)
    advantages = spread_over_tokens(group_relative_scalars(stats, norm_by_std, epsilon), batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages


@ESTIMATORS.register(
    "dr_grpo",
    paper="arXiv:2503.20783",
    summary="score - group mean (GRPO without the std division)",
    properties=("group_zero_sum", "reward_shift_invariant", "group_shift_invariant", "group_local"),
)
@torch.no_grad()
def dr_grpo(
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
    """Dr.GRPO outcome advantage: A_i = s_i - mean_g (GRPO without the std division).

    "Understanding R1-Zero-Like Training" (arXiv:2503.20783): dividing by the
    group std over-weights questions that are too easy or too hard. This is
    ``grpo(..., norm_by_std=False)`` under its own name; verl spells it
    ``grpo`` with ``norm_adv_by_std_in_grpo=False``, OpenRLHF ``dr_grpo``. (TRL's
    ``loss_type="dr_grpo"`` is a loss aggregation, not this estimator.)

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
        norm_by_std: ignored; always False here (that is the estimator).
        epsilon: ignored (no division).
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) s_i - mean_g on valid tokens, 0 elsewhere.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes.
        TypeError: an unknown option.

    A group with one non-empty response gets 0 (verl: the raw score s_i).
    """
    reject_unknown_options("dr_grpo", options)
    batch = prepare_batch("dr_grpo", token_level_rewards, response_mask)
    _, _, stats = outcome_group_stats("dr_grpo", batch, index)
    advantages = spread_over_tokens(group_relative_scalars(stats, False, 0.0), batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
