"""ReMax: REINFORCE with the greedy response's reward as baseline."""

from __future__ import annotations

from typing import Any

import torch

from estimators import math_mode
from estimators.discounted_returns import discounted_returns, discounted_returns_fused
from estimators.input_checks import (
    check_discount,
    prepare_batch,
    reject_unknown_options,
    row_tensor,
)
from rlkit.registry import ESTIMATORS


@ESTIMATORS.register(
    "remax",
    paper="arXiv:2310.10505",
    summary="return-to-go minus the greedy response's reward",
    needs_reward_baselines=True,
    properties=("group_local",),
    properties_exempt=("singleton_group_zero", "equal_scores_zero"),
)
@torch.no_grad()
def remax(
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
    """ReMax advantage: A_t = G_t - b with G_t the return-to-go and b the greedy reward.

    ReMax (arXiv:2310.10505): the baseline of each sampled response is the
    reward of the greedy response to the same prompt, ``reward_baselines``.
    G_t = sum of rewards on valid tokens from t on (mask-0 tokens skipped, their
    rewards ignored), discounted by gamma per valid token (``discounted_returns``:
    a loop under ``estimators.set_math("plain")``, else its fused twin). No whitening.

    Differences from verl: verl has no discount (it is gamma = 1, the default
    here) and leaves returns on mask-0 tokens; here both outputs are 0 there.

    Property kit (``rlkit.testing``): exempt from ``singleton_group_zero`` and
    ``equal_scores_zero``: ReMax has no groups (``index`` is ignored), so a
    response alone in its group, or a group of equal scores, gets its own
    advantage, not 0. Declares ``group_local``:
    each row depends on its own rewards and baseline only.

    Args:
        token_level_rewards: (B, T) rewards.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: ignored.
        values: ignored.
        reward_baselines: (B,) reward of each prompt's greedy response. Required.
        gamma: discount in [0, 1] per valid token (1 = ReMax / verl).
        lam: ignored.
        norm_by_std: ignored.
        epsilon: ignored.
        **options: none understood; any key raises TypeError.

    Returns:
        advantages: (B, T) G_t - b on valid tokens, 0 elsewhere.
        returns: (B, T) G_t on valid tokens, 0 elsewhere.

    Raises:
        ValueError: ``reward_baselines`` missing or not (B,); bad shapes; gamma
            outside [0, 1].
        TypeError: an unknown option.
    """
    reject_unknown_options("remax", options)
    check_discount("remax", gamma=gamma)
    batch = prepare_batch("remax", token_level_rewards, response_mask)
    baselines = row_tensor(
        "remax",
        "reward_baselines",
        reward_baselines,
        batch,
        "reward of the greedy response to each prompt",
    )
    returns = math_mode.choose(discounted_returns, discounted_returns_fused)(
        batch.rewards, batch.mask, gamma=gamma
    )
    advantages = returns - baselines[:, None] * batch.mask_f
    return batch.finish(advantages, returns)
