"""The common tail of every policy loss: IS weights, aggregation, metrics."""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.aggregation import Normaliser, aggregate_loss, masked_mean


def reduce_token_loss(
    loss_mat: Tensor,
    weights: Tensor,
    loss_agg_mode: str,
    rollout_is_weights: Tensor | None,
    *,
    num_tokens: Normaliser,
    num_seqs: Normaliser,
    norm_length: Normaliser,
) -> Tensor:
    """Multiply by the (detached) rollout IS weights, then aggregate to a scalar.

    ``weights`` is the response mask as float token weights (``mask_weights``),
    computed once per loss call. ``loss_mat`` must be finite at padding (the
    losses sanitise their inputs), so the mask is applied by a product; IS
    weights, which come from outside, may hold anything at padding and switch
    to the NaN-proof masking.
    """
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights.detach()
    return aggregate_loss(
        loss_mat,
        weights,
        loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        padding_finite=rollout_is_weights is None,
    )


def policy_metrics(
    response_mask: Tensor,
    weights: Tensor,
    delta: Tensor,
    *,
    clipped: Tensor | None = None,
    clipped_lower: Tensor | None = None,
    **extras: Tensor | float,
) -> dict[str, Tensor]:
    """The metrics every policy loss reports, as detached 0-dim tensors.

    Args:
        response_mask: (B, T) mask; every metric is a mean over its valid tokens.
        weights: the same mask as float token weights (``mask_weights``).
        delta: (B, T) Δ = log π − log π_old, finite at padding; ``ppo_kl`` = mean(−Δ).
        clipped: (B, T) bool where the (upper/PPO) clip binds -> ``pg_clipfrac``;
            None -> 0 (the loss has no such clip).
        clipped_lower: (B, T) bool where the dual clip binds -> ``pg_clipfrac_lower``.
        **extras: further (B, T) tensors (finite at padding), each reported as
            its masked mean, or 0-dim tensors / floats reported as they are.

    Returns:
        dict with ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` and ``extras``.
    """
    delta = delta.detach()

    def mean(x: Tensor | None) -> Tensor:
        if x is None:
            return delta.new_zeros(())
        if x.dtype == torch.bool:
            return masked_mean(x, response_mask, dtype=delta.dtype)
        return masked_mean(x.detach(), weights, padding_finite=True)

    metrics = {
        "pg_clipfrac": mean(clipped),
        "ppo_kl": -mean(delta),
        "pg_clipfrac_lower": mean(clipped_lower),
    }
    for name, value in extras.items():
        if isinstance(value, Tensor) and value.dim() == 2:
            metrics[name] = mean(value)
        else:
            metrics[name] = torch.as_tensor(value, dtype=delta.dtype, device=delta.device)
    return metrics
