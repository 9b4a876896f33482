"""Importance ratios between the current and the old policy, in plain torch.

Δ = log π_θ(y_t) − log π_old(y_t), r = e^Δ. Padding is set to Δ = 0 with
``torch.where`` *before* anything else: a model may leave garbage (even ±inf) in
padded log-probs, and ``where`` passes neither its NaN values (−inf − (−inf)) nor a
NaN gradient (its backward sends 0 to the branch it did not pick).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

#: verl's clamp on Δ before ``exp`` (e^20 ≈ 4.9e8): no overflow to inf.
LOG_RATIO_BOUND = 20.0
#: verl's clamp (upper only) on GSPO's log sequence ratio before ``exp``.
LOG_SEQ_RATIO_MAX = 10.0


class SurrogateTerms(NamedTuple):
    """What a clipped surrogate gives per token, (B, T) each.

    Attributes:
        loss: the per-token loss, finite at padding (mask it when aggregating).
        clipped: bool, where the (upper / PPO) clip binds -> ``pg_clipfrac``.
        clipped_lower: bool, where the dual (or lower) clip binds ->
            ``pg_clipfrac_lower``; None when the loss has no such clip.
        log_ratio: detached Δ reported as ``ppo_kl`` (0 at padding).
    """

    loss: Tensor
    clipped: Tensor
    clipped_lower: Tensor | None
    log_ratio: Tensor


def valid_tokens(response_mask: Tensor) -> Tensor:
    """(B, T) bool: the tokens that count."""
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def log_ratio(
    log_prob: Tensor, old_log_prob: Tensor, valid: Tensor, *, clamp: bool = True
) -> Tensor:
    """Δ = log_prob − old_log_prob, 0 at padding, optionally clamped to ±20.

    Args:
        log_prob: (B, T) current log-probs (with or without gradient).
        old_log_prob: (B, T) behaviour-policy log-probs.
        valid: (B, T) bool from :func:`valid_tokens`.
        clamp: clamp to ±``LOG_RATIO_BOUND`` (verl's vanilla/cispo/sapo do); the
            gradient passes inside the bounds, bounds included (``torch.clamp``).

    Returns:
        (B, T) Δ, finite at padding whatever the inputs hold there.
    """
    delta = torch.where(valid, log_prob - old_log_prob, 0.0)
    return delta.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) if clamp else delta


def safe_log_prob(log_prob: Tensor, valid: Tensor) -> Tensor:
    """``log_prob`` with padding set to 0 (for losses that use log π directly)."""
    return torch.where(valid, log_prob, 0.0)
