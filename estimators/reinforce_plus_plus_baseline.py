"""REINFORCE++ with a group baseline: group-centred scores, whitened over the batch's tokens."""

from __future__ import annotations

from typing import Any

import torch

from estimators.input_checks import prepare_batch, reject_unknown_options
from estimators.masked_stats import whiten_row_scalars
from estimators.outcome_scores import outcome_group_stats, spread_over_tokens
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "reinforce_plus_plus_baseline",
    aliases=("reinforce_pp_baseline",),
    paper="arXiv:2501.03262",
    summary="(score - group mean), whitened over the batch's tokens",
    properties=("reward_shift_invariant", "group_shift_invariant"),
    properties_exempt=("singleton_group_zero", "equal_scores_zero"),
)
@torch.no_grad()
def reinforce_plus_plus_baseline(
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
    """REINFORCE++-baseline: A = masked_whiten(s_i - mean_g) over the batch's valid tokens.

    REINFORCE++ (arXiv:2501.03262) with the group mean as baseline: the
    centred score s_i - mean_g (s_i = sum_t r_{i,t} m_{i,t}, groups from
    ``index``) is put on every valid token, then whitened with one mean and
    unbiased variance over all valid tokens of the batch (no per-group std).
    Longer responses therefore weigh more in the whitening statistics, as in
    verl. Computed from per-row scalars and lengths (O(B)), equal to whitening
    the (B, T) tensor.

    Degenerate inputs: a group with one non-empty response is centred to 0
    before whitening (verl keeps its raw score); empty responses are 0 and
    left out of both group and whitening statistics; fewer than two valid
    tokens in the batch: centred only (verl divides by zero).

    Property kit (``rlkit.testing``): exempt from ``singleton_group_zero`` and
    ``equal_scores_zero``: such rows are centred to exactly 0, but the whitening
    over the batch's tokens then subtracts the batch mean and rescales, so they
    get the whitened value of 0, not 0. Declares ``reward_shift_invariant`` and
    ``group_shift_invariant`` (the group mean absorbs any per-group shift).

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored.
        lam: ignored.
        norm_by_std: ignored (the whitening always divides by the batch std).
        epsilon: ignored (the whitening adds 1e-8 to the variance, as verl).
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) whitened centred scores on valid tokens, 0 elsewhere.
        returns: (B, T) the same tensor as ``advantages``.

    Raises:
        ValueError: ``index`` missing or malformed; bad shapes.
        TypeError: an unknown option.
    """
    reject_unknown_options("reinforce_plus_plus_baseline", options)
    batch = prepare_batch("reinforce_plus_plus_baseline", token_level_rewards, response_mask)
    _, lengths, stats = outcome_group_stats("reinforce_plus_plus_baseline", batch, index)
    advantages = spread_over_tokens(whiten_row_scalars(stats.centred, lengths), batch)
    (advantages,) = batch.finish(advantages)
    return advantages, advantages
