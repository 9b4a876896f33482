"""``sapo``: Soft Adaptive Policy Optimization (arXiv:2511.20347).

A smooth gate replaces the hard clip::

    f_τ(r) = sigmoid(τ·(r − 1)) · 4/τ,   τ = τ_pos if A > 0 else τ_neg
    L = −f_τ(r) · A,                     r = exp(clamp(Δ, ±20))

On-policy (r = 1) the gradient equals PPO's (−A·∇r); far from r = 1 it decays
smoothly instead of being cut. τ_neg > τ_pos damps negative-advantage updates
faster (the paper's 1.0 / 1.05).

Difference from verl: verl *ignores* ``loss_agg_mode`` and always uses
``seq-mean-token-mean``; rlkit honours it (pass ``seq-mean-token-mean`` for
verl's numbers). TRL's ``sapo`` omits the 4/τ factor in some versions.
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
from algorithms.losses.ratio import log_ratio, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


@POLICY_LOSSES.register(
    "sapo", paper="arXiv:2511.20347", properties=("reduces_to_vanilla_at_ratio_one",)
)
def sapo(
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
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO: a soft sigmoid gate −sigmoid(τ(r−1))·4/τ·A instead of a hard clip.

    τ = tau_pos where A > 0, else tau_neg; r = exp(clamp(Δ, ±20)). arXiv:2511.20347.
    verl forces ``seq-mean-token-mean``; rlkit honours ``loss_agg_mode``.

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one`` (the gate's slope
    at r = 1 is 1).

    Args:
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation mode (verl: always ``seq-mean-token-mean``).
        clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c: unused.
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.
        tau_pos: gate temperature for A > 0, > 0.
        tau_neg: gate temperature for A <= 0, > 0.
        **options: any other key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0, ``ppo_kl`` (mean −Δ).
    """
    reject_unknown_options("sapo", options, ("tau_pos", "tau_neg"))
    check_inputs("sapo", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)  # unused, but validated
    check_range("sapo", "tau_pos", tau_pos, low=0.0)
    check_range("sapo", "tau_neg", tau_neg, low=0.0)
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    delta = log_ratio(log_prob, old_log_prob, valid)
    tau = torch.where(advantages > 0, delta.new_tensor(tau_pos), delta.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (torch.exp(delta) - 1.0)) * (4.0 / tau)
    loss = reduce_token_loss(
        -gate * advantages,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    return loss, policy_metrics(response_mask, weights, delta)
