"""Whitening over the valid (mask-1) tokens of a batch.

verl's ``masked_whiten``: one mean and one Bessel-corrected variance over all
mask-1 tokens of the batch, then ``(x - mean) * rsqrt(var + 1e-8)``; its token
means divide by ``count + 1e-8``, kept here so the numbers agree to rounding.
Differences: the result is 0 on mask-0 tokens (verl writes whitened values
there), and fewer than two valid tokens, where verl divides by zero or raises,
give the centred values ``x - mean`` (with one valid token that is exactly 0).
"""

from __future__ import annotations

import torch

#: Added to the variance before the reciprocal square root, as in verl.
WHITEN_EPS = 1e-8
#: Added to token counts in verl's masked means.
COUNT_EPS = 1e-8


def _count_divisor(count: torch.Tensor) -> torch.Tensor:
    # verl's count + 1e-8 where whitening is defined; the exact count below two
    # tokens, so that a single token centres to exactly 0.
    return torch.where(count >= 2, count + COUNT_EPS, count.clamp(min=1))


def _scale(count: torch.Tensor, sum_sq: torch.Tensor, eps: float) -> torch.Tensor:
    variance = sum_sq / _count_divisor(count) * count / (count - 1).clamp(min=1)
    return torch.where(count >= 2, torch.rsqrt(variance + eps), 1.0)


def masked_whiten(x: torch.Tensor, mask_f: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """Whiten ``x`` with statistics of its mask-1 entries; 0 on mask-0 entries.

    Args:
        x: (B, T) values.
        mask_f: (B, T) 0/1 mask in ``x``'s dtype.
        eps: added to the variance before ``rsqrt``.

    Returns:
        (B, T) new tensor ``(x - mean) * rsqrt(var + eps) * mask`` with mean and
        unbiased var over mask-1 entries; ``(x - mean) * mask`` when there are
        fewer than two of them.
    """
    return masked_whiten_(x * mask_f, mask_f, eps)


def masked_whiten_(x: torch.Tensor, mask_f: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """In-place :func:`masked_whiten` of an ``x`` that is already 0 on mask-0 entries.

    Scan outputs are 0 on mask-0 tokens, so whitening them needs neither a
    masked sum nor a new (B, T) tensor.

    Args:
        x: (B, T) values, 0 where ``mask_f`` is 0; overwritten.
        mask_f: (B, T) 0/1 mask in ``x``'s dtype.
        eps: added to the variance before ``rsqrt``.

    Returns:
        ``x``, whitened.
    """
    count = mask_f.sum()
    mean = x.sum() / _count_divisor(count)
    # x - mean * mask: the centred values on valid entries, still 0 elsewhere.
    centred = x.addcmul_(mask_f, mean, value=-1).reshape(-1)
    return x.mul_(_scale(count, torch.dot(centred, centred), eps))


def whiten_row_scalars(
    scalars: torch.Tensor, lengths: torch.Tensor, eps: float = WHITEN_EPS
) -> torch.Tensor:
    """Whiten per-row scalars as if each were repeated on its row's valid tokens.

    Equal to ``masked_whiten(scalars[:, None] * mask, mask)`` read on valid
    tokens, at O(B) instead of O(B*T): a row of length n is n equal tokens.

    Args:
        scalars: (B,) one value per row.
        lengths: (B,) number of valid tokens of each row (float).
        eps: added to the variance before ``rsqrt``.

    Returns:
        (B,) whitened scalars (centred only when fewer than two valid tokens; 0
        for rows without valid tokens).
    """
    count = lengths.sum()
    mean = torch.dot(scalars, lengths) / _count_divisor(count)
    # Rows without tokens stay 0: an overflowing square times a length of 0 is NaN.
    centred = torch.where(lengths > 0, scalars - mean, 0.0)
    return centred * _scale(count, torch.dot(centred.square(), lengths), eps)
