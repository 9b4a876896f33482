"""Rollout importance-sampling correction for the trainer/inference mismatch.

The rollout engine (vLLM, SGLang, ...) samples from π_rollout, which differs
numerically from the trainer's π_old even with identical weights (precision,
kernels). The per-token weight w_t = π_old(y_t) / π_rollout(y_t) corrects the
policy gradient for that mismatch (Yao et al., "Your efficient RL framework
secretly brings you off-policy RL training"; Liu, Li et al., "When speed kills
stability"). Weights multiply the per-token policy loss (``rollout_is_weights``
of every policy loss).

Levels:

* ``token``: log w_t = log π_old(y_t) − log π_rollout(y_t);
* ``sequence``: log w = Σ_t log w_t over the sequence's valid tokens (the product
  of the token ratios, formed in log space), broadcast to its tokens.

Log weights are clamped to ±20 before ``exp`` (verl's SAFETY_BOUND), so no
weight overflows; threshold tests use the unclamped log weights.

Modes (``ROLLOUT_CORRECTIONS``):

* ``truncate`` (alias ``tis``): truncated IS, w ← min(w, threshold) (and
  max(w, threshold_low) when ``threshold_low`` is given);
* ``mask`` (alias ``icepop``): IcePop, w ← w if threshold_low <= w <= threshold
  else 0 (``threshold_low`` defaults to 1/threshold). A zeroed token still
  counts in the loss normaliser.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from algorithms.aggregation import masked_mean, masked_values
from rlkit.registry import ROLLOUT_CORRECTIONS

#: verl's bound on |log w| before exponentiation: e^20 ≈ 4.9e8.
SAFETY_BOUND = 20.0
LEVELS = ("token", "sequence")


def _check_inputs(old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor) -> None:
    shapes = [tuple(t.shape) for t in (old_log_prob, rollout_log_prob, response_mask)]
    if len(set(shapes)) != 1 or len(shapes[0]) != 2:
        raise ValueError(
            "old_log_prob, rollout_log_prob and response_mask must share one (B, T) shape; "
            f"got {shapes}"
        )


def _bounds(threshold: float, threshold_low: float | None, *, default_low: bool) -> tuple:
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0, got {threshold}")
    if threshold_low is None and default_low:
        if threshold < 1:
            raise ValueError(
                f"threshold={threshold} < 1 leaves no band [1/threshold, threshold]; pass "
                "threshold >= 1 or an explicit threshold_low"
            )
        threshold_low = 1.0 / threshold
    if threshold_low is not None and not (0 < threshold_low <= threshold):
        raise ValueError(
            f"threshold_low must satisfy 0 < threshold_low <= threshold ({threshold}), "
            f"got {threshold_low}"
        )
    return threshold, threshold_low


def _log_weights(
    old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor, level: str
) -> Tensor:
    """Unclamped log weights, (B, T); 0 at padding."""
    token_log_w = masked_values(old_log_prob.detach() - rollout_log_prob.detach(), response_mask)
    if level == "token":
        return token_log_w
    if level == "sequence":
        return token_log_w.sum(dim=-1, keepdim=True).expand_as(token_log_w)
    raise ValueError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")


def _diagnostics(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    log_w: Tensor,
    weights: Tensor,
) -> dict[str, Tensor]:
    valid = response_mask != 0
    token_log_w = masked_values(old_log_prob.detach() - rollout_log_prob.detach(), response_mask)
    token_log_w = token_log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    if valid.any():
        w_max, w_min = raw[valid].max(), raw[valid].min()
    else:
        w_max = w_min = raw.new_zeros(())
    return {
        "rollout_is/mean": masked_mean(weights, response_mask),
        "rollout_is/max": w_max,
        "rollout_is/min": w_min,
        # KL(π_rollout ‖ π_old) from rollout samples: k1 = −log w, k3 = w − 1 − log w.
        "rollout_is/mismatch_kl_k1": masked_mean(-token_log_w, response_mask),
        "rollout_is/mismatch_kl": masked_mean(
            (torch.expm1(token_log_w) - token_log_w).clamp(min=0.0), response_mask
        ),
    }


@ROLLOUT_CORRECTIONS.register("truncate", aliases=("tis",))
@torch.no_grad()
def truncated_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance sampling (TIS): w = min(π_old/π_rollout, threshold).

    Args:
        old_log_prob: (B, T) log-probs of the sampled tokens under the trainer.
        rollout_log_prob: (B, T) the same reported by the rollout engine.
        response_mask: (B, T) mask.
        level: ``"token"`` or ``"sequence"``.
        threshold: upper truncation bound (> 0).
        threshold_low: optional lower bound; weights below it are raised to it.

    Returns:
        weights: (B, T) detached, 0 at padding.
        metrics: ``rollout_is/{mean,max,min,clip_frac,mismatch_kl,mismatch_kl_k1}``
        (detached 0-dim; max/min of the untruncated weights, clip_frac = fraction
        of valid tokens whose weight was truncated).
    """
    _check_inputs(old_log_prob, rollout_log_prob, response_mask)
    threshold, threshold_low = _bounds(threshold, threshold_low, default_low=False)
    log_w = _log_weights(old_log_prob, rollout_log_prob, response_mask, level)
    weights = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).clamp(max=threshold)
    clipped = log_w > math.log(threshold)
    if threshold_low is not None:
        weights = weights.clamp(min=threshold_low)
        clipped = clipped | (log_w < math.log(threshold_low))
    weights = masked_values(weights, response_mask)
    metrics = _diagnostics(old_log_prob, rollout_log_prob, response_mask, log_w, weights)
    metrics["rollout_is/clip_frac"] = masked_mean(clipped, response_mask)
    return weights, metrics


@ROLLOUT_CORRECTIONS.register("mask", aliases=("icepop",))
@torch.no_grad()
def masked_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IcePop: w = π_old/π_rollout inside [threshold_low, threshold], else 0.

    Args:
        old_log_prob: (B, T) log-probs of the sampled tokens under the trainer.
        rollout_log_prob: (B, T) the same reported by the rollout engine.
        response_mask: (B, T) mask.
        level: ``"token"`` or ``"sequence"`` (a whole sequence is dropped).
        threshold: upper bound (>= 1 unless ``threshold_low`` is given).
        threshold_low: lower bound, default 1/threshold.

    Returns:
        weights: (B, T) detached, 0 at padding and outside the band.
        metrics: ``rollout_is/{mean,max,min,mask_frac,mismatch_kl,mismatch_kl_k1}``
        (mask_frac = fraction of valid tokens zeroed).
    """
    _check_inputs(old_log_prob, rollout_log_prob, response_mask)
    threshold, threshold_low = _bounds(threshold, threshold_low, default_low=True)
    log_w = _log_weights(old_log_prob, rollout_log_prob, response_mask, level)
    keep = (log_w <= math.log(threshold)) & (log_w >= math.log(threshold_low))
    weights = torch.where(keep, torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)), 0.0)
    weights = masked_values(weights, response_mask)
    metrics = _diagnostics(old_log_prob, rollout_log_prob, response_mask, log_w, weights)
    metrics["rollout_is/mask_frac"] = masked_mean(~keep, response_mask)
    return weights, metrics


def rollout_is_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    threshold: float = 2.0,
    threshold_low: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Rollout-correction weights of the named ``mode`` (see the module docstring).

    Args:
        old_log_prob: (B, T) trainer log-probs of the sampled tokens (π_old).
        rollout_log_prob: (B, T) rollout-engine log-probs of the same tokens.
        response_mask: (B, T) mask.
        level: ``"token"`` or ``"sequence"``.
        mode: ``"truncate"``/``"tis"`` or ``"mask"``/``"icepop"`` (``ROLLOUT_CORRECTIONS``).
        threshold: upper bound on the weight.
        threshold_low: lower bound (``mask`` default 1/threshold; ``truncate``
            default none).

    Returns:
        weights: (B, T) detached; pass as ``rollout_is_weights`` to a policy loss.
        metrics: dict of detached 0-dim tensors prefixed ``rollout_is/``.

    Raises:
        UnknownNameError: unknown ``mode``.
        ValueError: bad ``level``, thresholds or shapes.
    """
    fn = ROLLOUT_CORRECTIONS.get(mode)
    return fn(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        level=level,
        threshold=threshold,
        threshold_low=threshold_low,
    )
