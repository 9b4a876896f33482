"""REINFORCE++: discounted token returns, whitened over the batch (no critic, no groups)."""

from __future__ import annotations

from typing import Any

import torch

from estimators import math_mode
from estimators.discounted_returns import discounted_returns, discounted_returns_fused
from estimators.input_checks import check_discount, prepare_batch, reject_unknown_options
from estimators.masked_stats import masked_whiten
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "reinforce_plus_plus",
    aliases=("reinforce_pp",),
    paper="arXiv:2501.03262",
    summary="discounted return over valid tokens, whitened",
    properties_exempt=("singleton_group_zero", "equal_scores_zero"),
)
@torch.no_grad()
def reinforce_plus_plus(
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
    """REINFORCE++: G_t = r_t + gamma * G_{t'} over valid tokens, A = masked_whiten(G).

    REINFORCE++ (arXiv:2501.03262): the discounted return of every valid token
    (t' is the next valid token; mask-0 tokens are skipped and their rewards
    ignored), whitened with one mean and unbiased variance over all valid
    tokens of the batch. The returns come from ``discounted_returns_fused`` (no
    loop over T), or from the loop ``discounted_returns`` under
    ``estimators.set_math("plain")``.

    Difference from verl: verl resets the running return at every mask-0 token
    (written for right padding). With interior mask-0 spans (multi-turn
    observation tokens) verl's tokens before a span never see rewards after it;
    here they do, discounted by the number of valid tokens in between, the
    same skipping verl's GAE uses. For masks whose valid tokens are one
    contiguous run (right or left padding) both agree. verl also leaves
    returns on mask-0 tokens; here they are 0.

    Property kit (``rlkit.testing``): exempt from ``singleton_group_zero`` and
    ``equal_scores_zero``: REINFORCE++ has no groups (``index`` is ignored), so a
    response alone in its group, or a group of equal scores, gets its own
    advantage, not 0.

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: ignored (no groups).
        values: ignored (no critic).
        reward_baselines: ignored.
        gamma: discount in [0, 1] per valid token.
        lam: ignored.
        norm_by_std: ignored (the whitening always divides by the batch std).
        epsilon: ignored (the whitening adds 1e-8 to the variance, as verl).
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) whitened returns on valid tokens, 0 elsewhere
            (centred only with fewer than two valid tokens in the batch).
        returns: (B, T) G_t on valid tokens, 0 elsewhere.

    Raises:
        ValueError: bad shapes; gamma outside [0, 1].
        TypeError: an unknown option.
    """
    reject_unknown_options("reinforce_plus_plus", options)
    check_discount("reinforce_plus_plus", gamma=gamma)
    batch = prepare_batch("reinforce_plus_plus", token_level_rewards, response_mask)
    returns = math_mode.choose(discounted_returns, discounted_returns_fused)(
        batch.rewards, batch.mask, gamma=gamma
    )
    advantages = masked_whiten(returns, batch.mask_f)
    return batch.finish(advantages, returns)
