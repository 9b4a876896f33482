"""Per-group statistics of sequence scores, computed with scatter / index_add.

Groups are the samples drawn for one prompt. ``index`` names each row's group;
it is factorised once into dense ids 0..G-1 and everything after that is
vectorised over the batch (no loop over rows or groups).

Rows flagged invalid (fully masked responses) take no part in any statistic:
they do not count towards a group's size, mean or std.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def factorize_group_ids(
    index: Any, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to dense integer ids.

    Args:
        index: (B,) group ids: a 1-D tensor, a numpy array, or any sequence of
            hashable ids (e.g. uid strings). Rows with equal ids share a group.
        batch_size: B, the number of rows the ids must describe.
        device: device of the returned ids.

    Returns:
        group_ids: (B,) int64 tensor with values in [0, G).
        num_groups: G.

    Raises:
        ValueError: ``index`` is not one-dimensional or its length is not B.
    """
    if isinstance(index, torch.Tensor):
        if index.ndim != 1 or index.shape[0] != batch_size:
            raise ValueError(
                f"index must be a 1-D tensor of B = {batch_size} group ids, "
                f"got shape {tuple(index.shape)}"
            )
        uniques, inverse = torch.unique(index, return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), uniques.numel()
    if isinstance(index, np.ndarray) and index.dtype != object:
        if index.ndim != 1 or index.shape[0] != batch_size:
            raise ValueError(
                f"index must be a 1-D array of B = {batch_size} group ids, got shape {index.shape}"
            )
        uniques, inverse = np.unique(index, return_inverse=True)
        return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), len(uniques)
    return _factorize_hashables(index, batch_size, device)


def _factorize_hashables(
    index: Any, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    # Python objects (uid strings, tuples, mixed types) can only be hashed one by
    # one; this runs once per call, everything downstream is vectorised. Hashing
    # (not sorting or numpy coercion) keeps 1 and "1" apart.
    if isinstance(index, str | bytes) or not isinstance(index, Sequence | np.ndarray):
        raise ValueError(
            f"index must be a 1-D tensor, numpy array or sequence of B = {batch_size} hashable "
            f"group ids, got {type(index).__name__}"
        )
    if len(index) != batch_size:
        raise ValueError(
            f"index has {len(index)} group ids but the batch has B = {batch_size} rows"
        )
    dense: dict[Any, int] = {}
    try:
        ids = [dense.setdefault(key, len(dense)) for key in index]
    except TypeError as exc:
        raise ValueError(f"index entries must be hashable group ids: {exc}") from exc
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def group_sum(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(G,) sum of ``values`` (B,) within each group."""
    return values.new_zeros(num_groups).index_add_(0, group_ids, values)


def group_reduce(
    values: torch.Tensor, group_ids: torch.Tensor, num_groups: int, reduce: str, fill: float
) -> torch.Tensor:
    """(G,) ``reduce`` ("amax" / "amin") of ``values`` (B,) within each group; ``fill`` if empty."""
    out = values.new_full((num_groups,), fill)
    return out.scatter_reduce_(0, group_ids, values, reduce=reduce, include_self=True)


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each row's group, gathered back to rows.

    Attributes:
        group_ids: (B,) dense group id of each row.
        num_groups: G.
        valid: (B,) bool, the rows that take part (non-empty responses).
        size: (B,) number of valid rows in the row's group (float).
        centred: (B,) score minus its group mean; exactly 0 for invalid rows,
            for singleton groups and for groups whose scores are all equal.
        std: (B,) unbiased std of the row's group; 0 for groups of size < 2.
    """

    group_ids: torch.Tensor
    num_groups: int
    valid: torch.Tensor
    size: torch.Tensor
    centred: torch.Tensor
    std: torch.Tensor


def group_statistics(
    scores: torch.Tensor, group_ids: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> GroupStats:
    """Mean-centred scores and unbiased std of each group, over valid rows only.

    Scores are first shifted by their group minimum, so a group of equal scores
    centres to exactly 0 (no rounding residue for a later division by a tiny
    std to blow up) and large common offsets do not cost precision.

    Args:
        scores: (B,) sequence scores.
        group_ids: (B,) dense ids in [0, G).
        num_groups: G.
        valid: (B,) bool; invalid rows are left out of every statistic.

    Returns:
        The :class:`GroupStats`.
    """
    weight = valid.to(scores.dtype)
    count = group_sum(weight, group_ids, num_groups)
    floor = group_reduce(
        torch.where(valid, scores, torch.inf), group_ids, num_groups, "amin", torch.inf
    )
    floor = torch.where(count > 0, floor, 0.0)
    shifted = torch.where(valid, scores - floor[group_ids], 0.0)
    mean_shifted = group_sum(shifted, group_ids, num_groups) / count.clamp(min=1)
    centred = torch.where(valid, shifted - mean_shifted[group_ids], 0.0)
    sum_sq = group_sum(centred.square(), group_ids, num_groups)
    std = (sum_sq / (count - 1).clamp(min=1)).sqrt()
    return GroupStats(group_ids, num_groups, valid, count[group_ids], centred, std[group_ids])


def safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, with 0 where the denominator is 0 (no NaN/inf)."""
    zero = denominator == 0
    return torch.where(zero, 0.0, numerator / torch.where(zero, 1.0, denominator))
