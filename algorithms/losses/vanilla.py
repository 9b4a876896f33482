"""``vanilla``: PPO's clipped surrogate with decoupled clip-higher and dual-clip.

Per token, with r = exp(clamp(Δ, ±20)), Δ = log π_θ − log π_old::

    L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))        (PPO, arXiv:1707.06347)
    L = min(L, −A·c)              where A < 0                (dual-clip, arXiv:1912.09729)

ε_low < ε_high is DAPO's "clip-higher" (arXiv:2503.14476). Same numbers as verl's
``vanilla`` (``compute_policy_loss_vanilla``).
"""

from __future__ import annotations

from torch import Tensor

from algorithms.aggregation import Normaliser, mask_weights
from algorithms.losses.arguments import check_inputs, clip_bounds, reject_unknown_options
from algorithms.losses.ratio import clipped_surrogate, log_ratio, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


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
    """PPO clip loss with decoupled clip-higher and dual-clip (module docstring).

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
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers
            (``algorithms.global_normalizers``); None: this micro-batch's own.
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
    loss_mat, clipped, dual, delta = clipped_surrogate(
        log_prob,
        log_ratio(log_prob.detach(), old_log_prob, valid, clamp=False),
        advantages,
        valid,
        low=low,
        high=high,
        dual_clip=clip_ratio_c,
    )
    loss = reduce_token_loss(
        loss_mat,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    return loss, policy_metrics(response_mask, weights, delta, clipped=clipped, clipped_lower=dual)
