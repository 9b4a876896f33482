"""Random policy-loss inputs for the tests: log-probs, advantages, a ragged mask."""

from __future__ import annotations

import torch
from torch import Tensor


def random_batch(
    seed: int,
    batch: int,
    length: int,
    *,
    dtype: torch.dtype = torch.float64,
    spread: float = 0.3,
    keep: float = 0.7,
    empty_rows: int = 0,
) -> dict[str, Tensor]:
    """Random (B, T) policy-loss inputs: log-probs, advantages, a ragged mask.

    Args:
        seed: seed of the ``torch.Generator`` that draws everything.
        batch, length: B and T.
        dtype: dtype of the log-probs and advantages.
        spread: scale of log π − log π_old (0 gives exactly on-policy inputs).
        keep: probability that a token is valid.
        empty_rows: this many leading rows are fully masked.

    Returns:
        ``old`` (B, T), ``new`` (B, T, requires grad), ``adv`` (one advantage per row,
        occasionally 0, as group-normalised estimators produce) and ``mask`` (bool).
    """
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3.0
    new = old + spread * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, length)
    adv = adv * (torch.rand(batch, 1, generator=gen, dtype=torch.float64) > 0.15)
    mask = torch.rand(batch, length, generator=gen, dtype=torch.float64) < keep
    mask[: min(empty_rows, batch)] = False
    return {
        "old": old.to(dtype),
        "new": new.to(dtype).requires_grad_(),
        "adv": adv.contiguous().to(dtype),
        "mask": mask,
    }
