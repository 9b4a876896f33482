"""``cispo``: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585).

CISPO clips the *importance weight* and stops its gradient, so every token keeps
a REINFORCE-style gradient (none is dropped by a clip)::

    verl variant (default):  L = −sg(clip(r, 1 − ε_low, 1 + ε_high)) · A · log π_θ
    trl variant:             L = −sg(min(r, w_max)) · A · log π_θ

with r = exp(clamp(Δ, ±20)). The gradient w.r.t. log π_θ is −w·A.

Same name, different meaning: verl clips r into the band [1 − ε_low, 1 + ε_high]
(``clip_ratio_low/high``; MiniMax effectively disables the lower bound, e.g.
``clip_ratio_low=1.0``); TRL's ``loss_type="cispo"`` caps r at ``epsilon_high``
read as an *absolute* weight (e.g. 5.0) with no lower bound. Select TRL's form
with ``cispo_variant="trl"`` and give the cap as ``cispo_max_weight`` (default
5.0), never through ``clip_ratio_high``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.aggregation import Normaliser, mask_weights
from algorithms.losses.arguments import (
    check_inputs,
    check_range,
    clip_bounds,
    reject_unknown_options,
)
from algorithms.losses.ratio import log_ratio, safe_log_prob, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES

VARIANTS = ("verl", "trl")
#: Cap of the ``trl`` variant when none is given (TRL's recommended epsilon_high).
DEFAULT_TRL_MAX_WEIGHT = 5.0


@POLICY_LOSSES.register(
    "cispo", paper="arXiv:2506.13585", properties=("reduces_to_vanilla_at_ratio_one",)
)
def cispo(
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
    cispo_variant: str = "verl",
    cispo_max_weight: float | None = None,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: REINFORCE weighted by a clipped, detached importance ratio.

    L = −sg(w)·A·log π with w = clip(r, 1 − ε_low, 1 + ε_high) (``verl``) or
    w = min(r, w_max) (``trl``: TRL reads ``epsilon_high`` as that absolute cap).
    arXiv:2506.13585 (MiniMax-M1).

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one`` (w = 1: the
    gradient −A·∇log π is PPO's, although the value −A·log π is not).

    Args:
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation mode.
        clip_ratio, clip_ratio_low, clip_ratio_high: ε, ε_low, ε_high of the
            ``verl`` variant's band; ignored by ``trl``.
        clip_ratio_c: unused; accepted for the shared signature.
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.
        cispo_variant: ``"verl"`` (two-sided band) or ``"trl"`` (absolute cap).
        cispo_max_weight: the ``trl`` variant's cap w_max > 0 (default 5.0);
            giving it with the ``verl`` variant raises ValueError.
        **options: any other key raises TypeError.

    Returns:
        loss: 0-dim tensor (note: its value is −w·A·log π, not a PPO surrogate).
        metrics: ``pg_clipfrac`` (fraction of tokens whose weight was clipped),
        ``ppo_kl`` (mean −Δ), ``pg_clipfrac_lower`` (0).
    """
    reject_unknown_options("cispo", options, ("cispo_variant", "cispo_max_weight"))
    check_inputs("cispo", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    low, high = clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    if cispo_variant not in VARIANTS:
        raise ValueError(f"cispo: cispo_variant must be one of {VARIANTS}, got {cispo_variant!r}")
    if cispo_variant == "verl" and cispo_max_weight is not None:
        raise ValueError(
            "cispo: cispo_max_weight is the 'trl' variant's cap; the 'verl' variant clips "
            "to [1 - clip_ratio_low, 1 + clip_ratio_high]. Pass cispo_variant='trl' or drop it."
        )
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    delta = log_ratio(log_prob.detach(), old_log_prob, valid)
    ratio = torch.exp(delta)
    if cispo_variant == "verl":
        weight = ratio.clamp(1.0 - low, 1.0 + high)
    else:
        cap = DEFAULT_TRL_MAX_WEIGHT if cispo_max_weight is None else cispo_max_weight
        weight = ratio.clamp(max=check_range("cispo", "cispo_max_weight", cap, low=0.0))
    loss_mat = -weight * advantages * safe_log_prob(log_prob, valid)
    loss = reduce_token_loss(
        loss_mat,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    return loss, policy_metrics(response_mask, weights, delta, clipped=weight != ratio)
