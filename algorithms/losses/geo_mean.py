"""``geo_mean``: Geometric-Mean Policy Optimization, GMPO (arXiv:2507.20673).

The sequence objective uses the geometric mean of the token ratios, each
clipped in log space on the side that matters for the advantage's sign::

    Δ*_t = sgn(A)·min(sgn(A)·Δ_t, sgn(A)·clamp(Δ_t, −ε_low, ε_high))
    R_b  = exp(Σ_t Δ*_t m_t / (n_b + 1e-8)),    Ā_b = Σ_t A_t m_t / (n_b + 1e-8)
    L_b  = −Ā_b · R_b

L_b is a per-*sequence* loss; it is aggregated as if each valid token of row b
carried L_b (``algorithms.aggregation.aggregate_sequence_loss``), so with
``seq-mean-token-mean`` the loss is Σ_b L_b / num_seqs — verl's
``mean(L_b)`` when no row is fully masked (verl's mean also counts empty rows;
rlkit, like every aggregation mode, excludes them). verl ignores
``loss_agg_mode``; rlkit honours it (``token-mean`` weights rows by length).

Rollout IS weights (B, T) are reduced to one weight per sequence by their
geometric mean exp(Σ_t log(w_t + 1e-10) m_t / (n_b + 1e-8)), as in verl.

:func:`sign_aware_clip` is the clip in plain torch; by default the loss runs its fused
twin ``algorithms.losses.fused.sign_aware_clip_fused``, and
``algorithms.set_math("plain")`` selects the plain one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms import math_mode
from algorithms.aggregation import Normaliser, aggregate_sequence_loss, mask_weights
from algorithms.losses.arguments import check_inputs, clip_bounds, reject_unknown_options
from algorithms.losses.fused import sign_aware_clip_fused
from algorithms.losses.ratio import log_ratio, valid_tokens
from algorithms.losses.reduction import policy_metrics
from rlkit.registry import POLICY_LOSSES

#: verl's guards: in the sequence means and in the log of the IS weights.
LENGTH_EPS = 1e-8
WEIGHT_EPS = 1e-10


def sign_aware_clip(
    delta: Tensor, advantages: Tensor, *, low: float, high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """GMPO's log-space clip on the side that matters for A's sign, in plain torch.

    Δ* = sgn(A)·min(sgn(A)·Δ, sgn(A)·clamp(Δ, −ε_low, ε_high)) (verl's form), i.e.
    min(Δ, ε_high) where A > 0, max(Δ, −ε_low) where A < 0, 0 where A = 0.

    Args:
        delta: (B, T) Δ (with gradient), finite everywhere (0 at padding).
        advantages: (B, T) A.
        low, high: ε_low, ε_high of the band [−ε_low, ε_high].

    Returns:
        kept: (B, T) Δ*; clipped: (B, T) bool, Δ outside the band where A > 0;
        clipped_lower: (B, T) bool, Δ outside the band where A < 0.
    """
    sign = torch.sign(advantages)
    kept = sign * torch.minimum(sign * delta, sign * delta.clamp(-low, high))
    outside = (delta > high) | (delta < -low)
    return kept, outside & (advantages > 0), outside & (advantages < 0)


@POLICY_LOSSES.register(
    "geo_mean",
    aliases=("gmpo",),
    paper="arXiv:2507.20673",
    properties=("reduces_to_vanilla_at_ratio_one",),
)
def geo_mean(
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
    """GMPO: −Ā · geometric mean of the sign-aware clipped token ratios.

    L_b = −Ā_b·exp(mean_t Δ*_t), Δ* = min(Δ, ε_high) for A > 0, max(Δ, −ε_low) for
    A < 0; a per-sequence loss aggregated as if each valid token carried it.
    arXiv:2507.20673. verl always takes the plain mean over rows (use
    ``seq-mean-token-mean``).

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one`` for one
    advantage per sequence (with per-token advantages Ā_b replaces A_t).

    Args:
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A (GMPO assumes one advantage per sequence).
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation of the per-sequence loss (verl: mean over rows,
            i.e. ``seq-mean-token-mean``).
        clip_ratio, clip_ratio_low, clip_ratio_high: ε, ε_low, ε_high of the
            log-space clip [−ε_low, ε_high] (GMPO's paper uses e^±0.4, i.e. 0.4).
        clip_ratio_c: unused; accepted for the shared signature.
        rollout_is_weights: (B, T) detached weights, reduced per sequence (above).
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.
        **options: none; any key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` (Δ clipped, A > 0), ``pg_clipfrac_lower``
        (Δ clipped, A < 0), ``ppo_kl`` (mean −Δ).
    """
    reject_unknown_options("geo_mean", options)
    check_inputs("geo_mean", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    low, high = clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    delta = log_ratio(log_prob, old_log_prob, valid, clamp=False)
    pessimistic, clipped, clipped_lower = math_mode.choose(sign_aware_clip, sign_aware_clip_fused)(
        delta, advantages, low=low, high=high
    )
    counts = weights.sum(dim=-1)
    # Empty rows divide 0 by 1, not by the guard (which underflows to 0 in float16).
    lengths = torch.where(counts > 0, counts + LENGTH_EPS, 1.0)
    seq_ratio = torch.exp((pessimistic * weights).sum(dim=-1) / lengths)
    seq_advantage = (advantages * weights).sum(dim=-1) / lengths
    seq_loss = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach() + WEIGHT_EPS)
        log_w = torch.where(valid, log_w, 0.0)  # the weights may hold anything at padding
        seq_loss = seq_loss * torch.exp((log_w * weights).sum(dim=-1) / lengths)
    loss = aggregate_sequence_loss(
        seq_loss,
        response_mask,
        loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = policy_metrics(
        response_mask, weights, delta, clipped=clipped, clipped_lower=clipped_lower
    )
    return loss, metrics
