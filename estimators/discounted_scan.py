"""Reverse discounted cumulative sums, y_t = sum_{s >= t} d^(s - t) x_s, by chunked matmul.

This is the recurrence y_t = x_t + d * y_{t+1} behind GAE (d = gamma * lam) and
discounted returns (d = gamma), computed without a loop over time steps:

1. Split the sequence into N chunks of C steps. Inside a chunk, one matmul with
   the C x C upper-triangular decay matrix W[j, i] = d^(j - i) (j >= i) gives
   the within-chunk sums.
2. The sum at each chunk's first step, discounted over whole chunks, is the
   same recurrence one level up: a matmul with the N x N matrix d^(C (n' - n)).
3. Each step adds the next chunk's start value times d^(C - i).

Every power has a non-negative exponent, so nothing grows: d^k underflows to 0
for long spans instead of (gamma * lam)^(-t) overflowing, and T = 4096 with
d < 1 is as accurate as the step-by-step loop.

With mask skipping (verl's multi-turn semantics) the decay exponent must count
valid tokens only; :func:`masked_reverse_discounted_cumsum` therefore runs the
scan on the valid tokens packed to the front of each row
(:mod:`estimators.valid_token_compaction`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from estimators.valid_token_compaction import plan_packing

#: Chunk length for ordinary lengths: cost per element is about C + T / C^2
#: multiply-adds, smallest near C = (2T)^(1/3) = 20 for T = 4096; 32 runs fastest.
BASE_CHUNK = 32
#: Cap on the number of chunks N, so the N x N carry matrix stays small.
MAX_CHUNKS = 1024


def chunk_size(length: int) -> int:
    """Chunk length C for a sequence of ``length`` steps (32, longer past 32k steps)."""
    return max(1, min(BASE_CHUNK, length), -(-length // MAX_CHUNKS))


def _decay_matrix(size: int, decay: float, stride: int, like: torch.Tensor) -> torch.Tensor:
    return _cached_decay_matrix(size, float(decay), stride, like.dtype, like.device)


@functools.lru_cache(maxsize=64)
def _cached_decay_matrix(
    size: int, decay: float, stride: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    # Cached: the same few (C, d) pairs recur every training step. Callers never
    # write into the result.
    # W[j, i] = decay^(stride * (j - i)) for j >= i, else 0. Built in float64
    # from non-negative exponents; pow(0, 0) = 1 keeps decay = 0 exact. Powers
    # below the dtype's smallest normal number are flushed to 0: denormal
    # operands make CPU matmuls tens of times slower and add nothing.
    steps = torch.arange(size, dtype=torch.float64, device=device)
    exponent = (steps[:, None] - steps[None, :]) * stride
    base = torch.tensor(decay, dtype=torch.float64, device=device)
    weights = torch.where(exponent >= 0, base.pow(exponent.clamp(min=0)), 0.0)
    weights = torch.where(weights < torch.finfo(dtype).tiny, 0.0, weights)
    return weights.to(dtype)


def reverse_discounted_cumsum(x: torch.Tensor, decay: float) -> torch.Tensor:
    """Reverse discounted cumulative sum along the last dimension.

    Args:
        x: (B, L) values.
        decay: d in [0, 1].

    Returns:
        (B, L) y with y_t = sum_{s >= t} decay^(s - t) x_s.
    """
    batch, length = x.shape
    if batch == 0 or length == 0:
        return x.clone()
    chunk = chunk_size(length)
    num_chunks = -(-length // chunk)
    padded = F.pad(x, (0, num_chunks * chunk - length)) if num_chunks * chunk != length else x
    blocks = padded.reshape(batch, num_chunks, chunk)
    within = blocks @ _decay_matrix(chunk, decay, 1, x)  # (B, N, C)
    chunk_heads = within[:, :, 0]  # each chunk's sum discounted to its first step
    starts = chunk_heads @ _decay_matrix(num_chunks, decay, chunk, x)  # (B, N)
    next_starts = F.pad(starts[:, 1:], (0, 1))
    tail = _decay_matrix(chunk + 1, decay, 1, x)[chunk, :chunk]  # decay^(C - i), i < C
    within.addcmul_(next_starts[:, :, None], tail)
    return within.reshape(batch, num_chunks * chunk)[:, :length]


def masked_reverse_discounted_cumsum(
    x: torch.Tensor, mask: torch.Tensor, mask_f: torch.Tensor, decay: float
) -> torch.Tensor:
    """Reverse discounted cumsum over valid tokens only; 0 on mask-0 tokens.

    Mask-0 tokens are skipped, not reset: the value at a valid token sums the
    later valid tokens, discounted by the number of valid tokens between them
    (verl's treatment of multi-turn observation spans). Values of ``x`` on
    mask-0 tokens are ignored.

    Args:
        x: (B, T) values.
        mask: (B, T) bool valid-token mask.
        mask_f: (B, T) the same mask as 0/1 in ``x``'s dtype.
        decay: d in [0, 1].

    Returns:
        (B, T) the masked scan.
    """
    valid_x = x * mask_f
    if decay == 1.0:
        # Undiscounted: skipping mask-0 tokens only means not adding them.
        return reverse_discounted_cumsum(valid_x, 1.0).mul_(mask_f)
    packing = plan_packing(mask, mask_f)
    return packing.unpack(reverse_discounted_cumsum(packing.pack(valid_x), decay))
