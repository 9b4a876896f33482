"""Loop reference of the loss aggregation modes (``algorithms.aggregation``).

A per-token loss is a nested list of 0-dim tensors (None at padding); every mode is
summed row by row and token by token in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: verl's guard in ``seq-mean-token-mean``.
EPS_SEQ = 1e-8

TokenGrid = list[list]


def valid(mask: Tensor, b: int, t: int) -> bool:
    """Whether token (b, t) counts."""
    return bool(mask[b, t] != 0)


def weight(mask: Tensor, b: int, t: int) -> float:
    """The mask's entry as a token weight."""
    return float(mask[b, t])


def valid_positions(mask: Tensor) -> list[tuple[int, int]]:
    """(b, t) of every valid token, in row-major order."""
    rows, length = mask.shape
    return [(b, t) for b in range(rows) for t in range(length) if valid(mask, b, t)]


def grid(rows: int, length: int, fill: object = None) -> TokenGrid:
    """A (rows, length) nested list filled with ``fill``."""
    return [[fill for _ in range(length)] for _ in range(rows)]


def clamp(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    """``torch.clamp`` (its gradient passes inside the bounds, bounds included)."""
    return torch.clamp(x, min=lo, max=hi)


def aggregate(
    loss: TokenGrid,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Aggregate a nested list of per-token 0-dim losses (None at padding).

    Returns:
        0-dim float64 tensor: Σ L·m divided as the mode says (``algorithms.aggregation``).
    """
    rows, length = mask.shape
    total = torch.zeros((), dtype=torch.float64)
    row_sums, row_counts = [], []
    for b in range(rows):
        row, count = torch.zeros((), dtype=torch.float64), 0.0
        for t in range(length):
            if valid(mask, b, t):
                row = row + loss[b][t] * weight(mask, b, t)
                count += weight(mask, b, t)
        row_sums.append(row)
        row_counts.append(count)
        total = total + row
    if num_tokens is None:
        num_tokens = sum(row_counts)
    if num_seqs is None:
        num_seqs = sum(1 for c in row_counts if c > 0)
    if norm_length is None:
        norm_length = length
    num_tokens = num_tokens if num_tokens > 0 else 1
    num_seqs = num_seqs if num_seqs > 0 else 1
    if mode == "token-mean":
        return total / num_tokens
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return total / num_seqs / norm_length
    if mode == "seq-mean-token-mean":
        acc = torch.zeros((), dtype=torch.float64)
        for row, count in zip(row_sums, row_counts):
            acc = acc + row / (count + EPS_SEQ)
        return acc / num_seqs
    raise ValueError(mode)


def masked_mean(values: TokenGrid, mask: Tensor) -> float:
    """Mean of a nested list of floats over valid tokens (0 when none)."""
    rows, length = mask.shape
    num = den = 0.0
    for b in range(rows):
        for t in range(length):
            if valid(mask, b, t):
                num += float(values[b][t]) * weight(mask, b, t)
                den += weight(mask, b, t)
    return num / den if den > 0 else 0.0
