"""GAE: generalised advantage estimation from a critic's values (PPO).

:func:`gae_advantages` is the textbook reverse loop over time; :func:`gae_advantages_fused`
computes the same numbers without a loop (valid tokens packed to the front of each row,
then a chunked-matmul scan) and runs by default; ``estimators.set_math("plain")``
selects the loop.
"""

from __future__ import annotations

from typing import Any

import torch

from estimators import math_mode
from estimators.discounted_scan import reverse_discounted_cumsum
from estimators.input_checks import (
    bool_option,
    check_discount,
    prepare_batch,
    reject_unknown_options,
    token_tensor,
)
from estimators.masked_stats import masked_whiten_
from estimators.valid_token_compaction import plan_packing
from rlkit.registry import ESTIMATORS


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> torch.Tensor:
    """GAE's advantages by the textbook reverse loop over time (arXiv:1506.02438, eq. 16).

    With t' the next valid token after t (none: V_{t'} = A_{t'} = 0),
        delta_t = r_t + gamma * V_{t'} - V_t,    A_t = delta_t + gamma * lam * A_{t'}.
    A mask-0 token is skipped: V_{t'} and A_{t'} carry over it (verl's multi-turn rule).

    Args:
        rewards: (B, T) token rewards (ignored on mask-0 tokens).
        values: (B, T) critic values V_t (ignored on mask-0 tokens).
        mask: (B, T) bool valid-token mask.
        gamma: discount per valid token; lam: GAE lambda.

    Returns:
        (B, T) A_t on valid tokens, 0 on mask-0 tokens (not whitened).
    """
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_advantage = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        valid = mask[:, t]
        next_value = torch.where(valid, values[:, t], next_value)
        next_advantage = torch.where(valid, advantage, next_advantage)
        advantages[:, t] = torch.where(valid, advantage, 0.0)
    return advantages


def gae_advantages_fused(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> torch.Tensor:
    """:func:`gae_advantages` without a loop over time: same arguments, same numbers.

    Each row's valid tokens are packed to the front (``valid_token_compaction``), so
    consecutive packed slots are consecutive valid tokens; there delta_t needs only the
    next slot's value, and A is one reverse discounted cumulative sum of the deltas
    with decay gamma * lam (``discounted_scan``: chunked matmuls, no negative powers,
    stable over T = 4096 for gamma * lam < 1).

    Returns:
        (B, T) A_t on valid tokens, 0 on mask-0 tokens (not whitened).
    """
    mask_f = mask.to(rewards.dtype)
    valid_values = values * mask_f
    packing = plan_packing(mask, mask_f)
    packed_values = packing.pack(valid_values)
    deltas = packing.pack((rewards * mask_f).sub_(valid_values))
    # In packed rows the next slot is the next valid token; past the last one it is 0.
    deltas[:, :-1].add_(packed_values[:, 1:], alpha=gamma)
    return packing.unpack(reverse_discounted_cumsum(deltas, gamma * lam))


@ESTIMATORS.register(
    "gae",
    paper="arXiv:1506.02438",
    summary="GAE with a critic; skips mask-0 tokens; whitened",
    needs_values=True,
    properties_exempt=("singleton_group_zero", "equal_scores_zero"),
)
@torch.no_grad()
def gae(
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
    """GAE (arXiv:1506.02438): A_t = sum_k (gamma * lam)^k delta_{t+k}, over valid tokens.

    With t' the next valid token after t (none: V_{t'} = 0),
        delta_t = r_t + gamma * V_{t'} - V_t,    A_t = delta_t + gamma * lam * A_{t'},
        returns_t = A_t + V_t   (before whitening),
    then, by default, A is whitened over all valid tokens of the batch. Mask-0
    tokens are skipped exactly as verl does for multi-turn observation spans:
    V' and A' carry over them, so the discount counts valid tokens only, and
    rewards on mask-0 tokens are ignored. Computed by :func:`gae_advantages_fused`
    (no loop over T), or by the loop :func:`gae_advantages` under
    ``estimators.set_math("plain")``.

    Differences from verl: outputs are 0 on mask-0 tokens (verl leaves the
    carried advantage and whitened values there); whitening with fewer than two
    valid tokens in the batch only centres (verl divides by zero); whitening
    can be turned off. TRL's and OpenRLHF's GAE do not skip mask-0 tokens.

    Property kit (``rlkit.testing``): exempt from ``singleton_group_zero`` and
    ``equal_scores_zero``: GAE has no groups (``index`` is ignored), so a
    response alone in its group, or a group of equal scores, gets its own
    advantage, not 0.

    Args:
        token_level_rewards: (B, T) per-token rewards (e.g. outcome reward on
            the last token minus a KL penalty).
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: ignored (no groups).
        values: (B, T) critic values V_t. Required.
        reward_baselines: ignored.
        gamma: discount in [0, 1] per valid token.
        lam: GAE lambda in [0, 1].
        norm_by_std: ignored (use the ``whiten`` option).
        epsilon: ignored (the whitening adds 1e-8 to the variance, as verl).
        **options: ``whiten`` (bool, default True): whiten the advantages over
            the batch's valid tokens. Any other key raises TypeError.

    Returns:
        advantages: (B, T) (whitened) A_t on valid tokens, 0 elsewhere.
        returns: (B, T) A_t + V_t (unwhitened A) on valid tokens, 0 elsewhere.

    Raises:
        ValueError: ``values`` missing or not (B, T); bad shapes; gamma or lam
            outside [0, 1].
        TypeError: an unknown option or a non-bool ``whiten``.
    """
    reject_unknown_options("gae", options, known=("whiten",))
    whiten = bool_option("gae", options, "whiten", True)
    check_discount("gae", gamma=gamma, lam=lam)
    batch = prepare_batch("gae", token_level_rewards, response_mask)
    values = token_tensor("gae", "values", values, batch, "critic values V_t")
    advantages = math_mode.choose(gae_advantages, gae_advantages_fused)(
        batch.rewards, values, batch.mask, gamma=gamma, lam=lam
    )
    returns = advantages + values * batch.mask_f
    if whiten:
        advantages = masked_whiten_(advantages, batch.mask_f)
    return batch.finish(advantages, returns)
