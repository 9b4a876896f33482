"""GAE: generalised advantage estimation from a critic's values (PPO)."""

from __future__ import annotations

from typing import Any

import torch

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
    rewards on mask-0 tokens are ignored. Computed by packing each row's valid
    tokens to the front and running a chunked matmul scan (no loop over T);
    stable over T = 4096 for gamma * lam < 1.

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
    valid_values = values * batch.mask_f
    packing = plan_packing(batch.mask, batch.mask_f)
    packed_values = packing.pack(valid_values)
    deltas = packing.pack((batch.rewards * batch.mask_f).sub_(valid_values))
    # In packed rows the next slot is the next valid token; past the last one it is 0.
    deltas[:, :-1].add_(packed_values[:, 1:], alpha=gamma)
    advantages = packing.unpack(reverse_discounted_cumsum(deltas, gamma * lam))
    returns = advantages + valid_values
    if whiten:
        advantages = masked_whiten_(advantages, batch.mask_f)
    return batch.finish(advantages, returns)
