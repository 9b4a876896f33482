"""Loop reference of the rollout importance-sampling weights (``algorithms.rollout_correction``)."""

from __future__ import annotations

import math

from torch import Tensor

from algorithms.reference.aggregation_loops import TokenGrid, grid, valid, weight


def rollout_weights(
    old: Tensor,
    rollout: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    hi: float = 2.0,
    lo: float | None = None,
) -> TokenGrid:
    """Rollout IS weights as a nested list (0 at padding).

    Args:
        old: (B, T) log π_old; rollout: (B, T) the rollout engine's log-probs.
        mask: (B, T) mask.
        level: ``token`` (per-token log-ratio) or ``sequence`` (the row's sum).
        mode: ``truncate`` (clip to [lo, hi]) or ``mask`` (0 outside [lo, hi]; lo
            defaults to 1 / hi).
        hi, lo: the thresholds.

    Returns:
        (B, T) nested list of weights times the mask.
    """
    rows, length = mask.shape
    out = grid(rows, length, 0.0)
    if mode == "mask" and lo is None:
        lo = 1.0 / hi
    for b in range(rows):
        seq = sum(float(old[b, t] - rollout[b, t]) for t in range(length) if valid(mask, b, t))
        for t in range(length):
            if not valid(mask, b, t):
                continue
            log_w = float(old[b, t] - rollout[b, t]) if level == "token" else seq
            w = math.exp(min(max(log_w, -20.0), 20.0))
            if mode == "truncate":
                w = min(w, hi)
                if lo is not None:
                    w = max(w, lo)
            else:
                w = w if math.log(lo) <= log_w <= math.log(hi) else 0.0
            out[b][t] = w * weight(mask, b, t)
    return out
