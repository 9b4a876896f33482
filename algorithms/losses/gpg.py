"""``gpg``: Group Policy Gradient (arXiv:2504.02546): plain REINFORCE, L = −A·log π_θ.

No importance ratio and no clipping; the GPG estimator (``estimators``) supplies
the rescaled advantages. Same value as verl's ``gpg``; verl returns no metrics,
rlkit returns the common ones (``ppo_kl`` is still informative).
"""

from __future__ import annotations

from torch import Tensor

from algorithms.aggregation import Normaliser, mask_weights
from algorithms.losses.arguments import check_inputs, clip_bounds, reject_unknown_options
from algorithms.losses.ratio import log_ratio, safe_log_prob, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


@POLICY_LOSSES.register(
    "gpg", paper="arXiv:2504.02546", properties=("reduces_to_vanilla_at_ratio_one",)
)
def gpg(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,
    num_tokens: Normaliser = None,
    num_seqs: Normaliser = None,
    norm_length: Normaliser = None,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE loss −A·log π_θ (GPG, arXiv:2504.02546).

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one`` (the gradient of
    −A·log π is −A·∇log π, PPO's at r = 1; the value differs).

    Args:
        old_log_prob: (B, T) log π_old (only for the ``ppo_kl`` metric).
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation mode.
        clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c: unused.
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.
        **options: none; any key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0, ``ppo_kl`` (mean −Δ).
    """
    reject_unknown_options("gpg", options)
    check_inputs("gpg", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)  # unused, but validated
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    loss_mat = -advantages * safe_log_prob(log_prob, valid)
    loss = reduce_token_loss(
        loss_mat,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    delta = log_ratio(log_prob.detach(), old_log_prob, valid, clamp=False)
    return loss, policy_metrics(response_mask, weights, delta)
