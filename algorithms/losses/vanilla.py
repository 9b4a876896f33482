"""``vanilla``: PPO's clipped surrogate with decoupled clip-higher and dual-clip.

Per token, with r = exp(clamp(Δ, ±20)), Δ = log π_θ − log π_old::

    L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))        (PPO, arXiv:1707.06347)
    L = min(L, −A·c)              where A < 0                (dual-clip, arXiv:1912.09729)

ε_low < ε_high is DAPO's "clip-higher" (arXiv:2503.14476). Same numbers as verl's
``vanilla`` (``compute_policy_loss_vanilla``).

:func:`vanilla_terms` is this math in plain torch; by default the loss runs its fused
twin ``algorithms.losses.fused.vanilla_terms_fused`` (same values, one autograd node),
and ``algorithms.set_math("plain")`` selects the plain one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms import math_mode
from algorithms.aggregation import Normaliser, mask_weights
from algorithms.losses.arguments import check_inputs, clip_bounds, reject_unknown_options
from algorithms.losses.fused import vanilla_terms_fused
from algorithms.losses.ratio import LOG_RATIO_BOUND, SurrogateTerms, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


def vanilla_terms(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    valid: Tensor,
    *,
    low: float,
    high: float,
    clip_ratio_c: float | None,
) -> SurrogateTerms:
    """PPO's clipped surrogate per token, in plain torch (gradient by autograd).

    r = exp(clamp(Δ, ±20)), Δ = log π_θ − log π_old;
    L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))     (arXiv:1707.06347)
    L = min(L, −A·c) where A < 0                          (dual clip, arXiv:1912.09729)

    Args:
        old_log_prob, log_prob, advantages: (B, T); padding may hold anything in the
            log-probs (even −inf).
        valid: (B, T) bool of the tokens that count.
        low, high: ε_low, ε_high.
        clip_ratio_c: dual-clip constant c > 1, or None for no dual clip.

    Returns:
        :class:`SurrogateTerms`: the per-token loss, where the clip binds (the clipped
        term strictly larger), where the dual clip binds (None without one), and the
        clamped Δ.
    """
    # Padding first: where() passes neither the NaN of −inf − (−inf) nor its gradient.
    log_ratio = torch.where(valid, log_prob - old_log_prob, 0.0)
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    surr1 = -advantages * ratio
    surr2 = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    loss = torch.maximum(surr1, surr2)
    dual = None
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    return SurrogateTerms(loss, surr2 > surr1, dual, log_ratio.detach())


@POLICY_LOSSES.register(
    "vanilla",
    aliases=("ppo",),
    paper="arXiv:1707.06347",
    properties=("reduces_to_vanilla_at_ratio_one",),
)
def vanilla(
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
    """PPO clip loss with decoupled clip-higher and dual-clip.

    L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), then min(L, −A·c) where A < 0;
    r = exp(clamp(log π − log π_old, ±20)). arXiv:1707.06347 (PPO), arXiv:1912.09729
    (dual-clip), arXiv:2503.14476 (DAPO clip-higher).

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one``.

    Args:
        old_log_prob: (B, T) log π_old of the sampled tokens.
        log_prob: (B, T) log π_θ of the same tokens (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask of the tokens that count.
        loss_agg_mode: aggregation (``AGGREGATIONS``), default ``token-mean``.
        clip_ratio: ε, default for both bounds.
        clip_ratio_low: ε_low (ratio floor 1 − ε_low), default ``clip_ratio``.
        clip_ratio_high: ε_high (ratio ceiling 1 + ε_high), default ``clip_ratio``.
        clip_ratio_c: dual-clip constant c > 1: for A < 0 the loss is capped at −A·c.
        rollout_is_weights: (B, T) rollout-correction weights multiplying the
            per-token loss (detached), or None.
        num_tokens, num_seqs, norm_length: the mini-batch's normalisers (the trainer
            passes them); None: this micro-batch's own.
        **options: none; any key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` (the PPO clip binds: clipped term > unclipped),
        ``ppo_kl`` (mean −Δ), ``pg_clipfrac_lower`` (the dual clip binds; A < 0).

    Raises:
        ValueError: ``clip_ratio_c`` <= 1, negative bounds, shape mismatch.
        TypeError: an unknown option.
    """
    reject_unknown_options("vanilla", options)
    check_inputs("vanilla", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    low, high = clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"vanilla: clip_ratio_c (the dual-clip cap on −A·r for A < 0) must be > 1, got "
            f"{clip_ratio_c}; use e.g. 3.0"
        )
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    terms = math_mode.choose(vanilla_terms, vanilla_terms_fused)(
        old_log_prob, log_prob, advantages, valid, low=low, high=high, clip_ratio_c=clip_ratio_c
    )
    loss = reduce_token_loss(
        terms.loss,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = policy_metrics(
        response_mask,
        weights,
        terms.log_ratio,
        clipped=terms.clipped,
        clipped_lower=terms.clipped_lower,
    )
    return loss, metrics
