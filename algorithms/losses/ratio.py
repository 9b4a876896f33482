"""Importance ratios between the current and the old policy, and PPO's clip.

Δ = log π_θ(y_t) − log π_old(y_t), r = e^Δ. Padding is set to Δ = 0 *before*
anything else, so garbage (even ±inf) log-probs at padded positions can give
neither NaN values nor NaN gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: verl's clamp on Δ before ``exp`` (e^20 ≈ 4.9e8): no overflow to inf.
LOG_RATIO_BOUND = 20.0


def valid_tokens(response_mask: Tensor) -> Tensor:
    """(B, T) bool: the tokens that count."""
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


class _MaskedLogRatio(torch.autograd.Function):
    """where(valid, a − b, 0), optionally clamped to ±bound, with a cheap backward.

    Autograd would run a ``where`` per op backwards; this saves one bool mask of
    the entries that pass the gradient (valid and inside the clamp, bounds
    included as in ``torch.clamp``) and multiplies by it.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        a: Tensor,
        b: Tensor | None,
        valid: Tensor,
        bound: float | None,
    ) -> Tensor:
        x = torch.where(valid, a if b is None else a - b, 0.0)
        keep = valid
        if bound is not None:
            clamped = x.clamp(-bound, bound)
            keep = valid & (clamped == x)
            x = clamped
        ctx.save_for_backward(keep)
        ctx.has_b = b is not None  # type: ignore[attr-defined]
        return x

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor | None, ...]:
        (keep,) = ctx.saved_tensors  # type: ignore[attr-defined]
        grad = grad * keep.view(torch.uint8).to(grad.dtype)
        grad_b = -grad if ctx.has_b and ctx.needs_input_grad[1] else None  # type: ignore[attr-defined]
        return grad, grad_b, None, None


def log_ratio(
    log_prob: Tensor, old_log_prob: Tensor, valid: Tensor, *, clamp: bool = True
) -> Tensor:
    """Δ = log_prob − old_log_prob, 0 at padding, optionally clamped to ±20.

    Args:
        log_prob: (B, T) current log-probs (with or without gradient).
        old_log_prob: (B, T) behaviour-policy log-probs.
        valid: (B, T) bool from :func:`valid_tokens`.
        clamp: clamp to ±``LOG_RATIO_BOUND`` (verl's vanilla/cispo/sapo do).

    Returns:
        (B, T) Δ, finite at padding whatever the inputs hold there.
    """
    return _MaskedLogRatio.apply(log_prob, old_log_prob, valid, LOG_RATIO_BOUND if clamp else None)


def safe_log_prob(log_prob: Tensor, valid: Tensor) -> Tensor:
    """``log_prob`` with padding set to 0 (for losses that use log π directly)."""
    return _MaskedLogRatio.apply(log_prob, None, valid, None)


class _ClippedSurrogate(torch.autograd.Function):
    """PPO's clipped surrogate (optionally dual-clipped) with a fused gradient.

    Autograd through clamp/maximum/minimum costs ~20 extra passes over (B, T);
    here the forward pass also forms dL/dx (x the log-ratio), so the backward
    pass is a single product. The gradient equals autograd's through the
    composite ops (clamp passes the gradient at its bounds; a tie of maximum's
    arguments means r lies inside the band, where both halves agree), except at
    the single point r = c of the dual clip, which gets 0 instead of half.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        log_prob: Tensor,
        log_ratio_value: Tensor,
        advantages: Tensor,
        valid: Tensor,
        low: float,
        high: float,
        dual_clip: float | None,
        bound_low: float | None,
        bound_high: float | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        log_ratio_value = log_ratio_value.expand_as(advantages)  # GSPO passes (B, 1)
        x = log_ratio_value.clamp(bound_low, bound_high)
        in_range = x == log_ratio_value  # clamp passes the gradient at its bounds
        ratio = torch.exp(x)
        unclipped = torch.mul(ratio, advantages).neg_()  # −A·r, also d(−A·r)/dx
        # −A·clip(r), formed in place in ``ratio`` (no longer needed): one buffer fewer
        clipped_term = ratio.clamp_(1.0 - low, 1.0 + high).mul_(advantages).neg_()
        active = unclipped >= clipped_term
        loss = torch.maximum(unclipped, clipped_term)
        grad = unclipped.mul_(_as_float(active & in_range & valid, unclipped.dtype))
        if dual_clip is None:
            dual = torch.zeros_like(active)
        else:
            # |A|·c equals −A·c where A < 0 and lies above the loss elsewhere
            # (A > 0: loss < 0; A = 0: loss = 0), so no select on the sign is needed.
            cap = advantages.abs().mul_(dual_clip)
            dual = loss > cap
            loss = torch.minimum(loss, cap)
            grad.mul_(_as_float(~dual, grad.dtype))
        ctx.save_for_backward(grad)
        clipped = ~active
        ctx.mark_non_differentiable(clipped, dual, x)
        return loss, clipped, dual, x

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor, *_: Tensor
    ) -> tuple[Tensor | None, ...]:
        (grad,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return (grad_loss * grad, None, None, None, None, None, None, None, None)


def _as_float(flags: Tensor, dtype: torch.dtype) -> Tensor:
    # A uint8 view converts much faster than bool.to(float) on CPU.
    return flags.view(torch.uint8).to(dtype)


def clipped_surrogate(
    log_prob: Tensor,
    log_ratio_value: Tensor,
    advantages: Tensor,
    valid: Tensor,
    *,
    low: float,
    high: float,
    dual_clip: float | None = None,
    bounds: tuple[float | None, float | None] = (-LOG_RATIO_BOUND, LOG_RATIO_BOUND),
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's pessimistic surrogate, per token, on r = exp(clamp(x, *bounds))::

        L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
        L = min(L, −A·c)   where A < 0   (only with ``dual_clip=c``)

    Args:
        log_prob: (B, T) log π_θ; the gradient flows to it as if x = log_prob − const.
        log_ratio_value: (B, T) or (B, 1) values of the log-ratio x (detached), finite
            everywhere (padding included: use :func:`log_ratio`); its derivative
            w.r.t. ``log_prob`` is taken to be 1 (token ratio log π_θ − log π_old,
            or GSPO's sg(log s) + log π_θ − sg(log π_θ)).
        advantages: (B, T) A (treated as data: no gradient).
        valid: (B, T) bool of the tokens that count.
        low, high: ε_low, ε_high (decoupled clip; DAPO's clip-higher when high > low).
        dual_clip: c > 1 of dual-clip PPO, or None.
        bounds: clamp of x before ``exp`` (verl: ±20 for token ratios, <= 10 for GSPO).

    Returns:
        loss: (B, T), finite at padding (mask it when aggregating); its gradient
            is 0 at padding and where a clip binds.
        clipped: (B, T) bool, the clipped term strictly larger (``pg_clipfrac``).
        dual: (B, T) bool, the dual clip binds (``pg_clipfrac_lower``).
        log_ratio: the clamped x actually exponentiated (shape of ``log_ratio_value``).
    """
    return _ClippedSurrogate.apply(
        log_prob,
        log_ratio_value.detach(),
        advantages.detach(),
        valid,
        float(low),
        float(high),
        None if dual_clip is None else float(dual_clip),
        *bounds,
    )
