"""Micro-batches and process shares that keep each prompt's rows together.

With shared-prefix passes (``ModelConfig.share_prompt_prefix``) the rows of a micro-batch
that share a prompt run it once (:mod:`rlkit.modeling.prefix_sharing`), so the updater
plans its micro-batches, and each process's share of a batch, by prompt group
(:func:`~rlkit.modeling.prefix_sharing.prompt_groups`) rather than by row.
"""

from __future__ import annotations

import torch

from rlkit.trainer.balancing import balanced_partitions, contiguous_partitions
from rlkit.trainer.batch import token_budget_split


def grouped_row_split(
    groups: list[list[int]], response_lengths: list[int], micro_batch_size: int
) -> list[torch.Tensor]:
    """Micro-batches of at most ``micro_batch_size`` rows that keep each prompt's rows
    together (a group larger than that is cut into chunks of that size).

    Chunks are ordered by their longest response, then filled into micro-batches in that
    order, so rows of similar length share one (as ``length_sorted_split`` does).

    Returns:
        Index tensors, each ascending; together a permutation of the rows.
    """
    chunks = [
        g[i : i + micro_batch_size] for g in groups for i in range(0, len(g), micro_batch_size)
    ]
    chunks.sort(key=lambda c: (max(response_lengths[r] for r in c), c[0]))
    parts: list[list[int]] = []
    for chunk in chunks:
        if parts and len(parts[-1]) + len(chunk) <= micro_batch_size:
            parts[-1] += chunk
        else:
            parts.append(list(chunk))
    return [torch.tensor(sorted(p), dtype=torch.long) for p in parts]


def grouped_token_split(
    groups: list[list[int]],
    prompt_lengths: list[int],
    response_lengths: list[int],
    max_tokens: int,
    min_parts: int = 1,
) -> list[torch.Tensor]:
    """Micro-batches whose packed shared-prefix rows fit ``max_tokens`` (one packed row
    per prompt: its length is the prompt plus the group's responses), keeping groups
    whole where a group fits; a longer group is cut into chunks that fit.

    Returns:
        Index tensors, each ascending, at least ``min_parts`` (empty ones pad).
    """
    units: list[list[int]] = []
    for group in groups:
        unit: list[int] = []
        for row in group:
            packed = prompt_lengths[row] + sum(response_lengths[r] for r in [*unit, row])
            if unit and packed > max_tokens:
                units.append(unit)
                unit = []
            unit.append(row)
        units.append(unit)
    packed = torch.tensor(
        [prompt_lengths[u[0]] + sum(response_lengths[r] for r in u) for u in units]
    )
    parts = token_budget_split(packed, max_tokens, min_parts=min_parts)
    return [
        torch.tensor(sorted(r for u in part.tolist() for r in units[u]), dtype=torch.long)
        for part in parts
    ]


def whole_group_shares(
    groups: list[list[int]], lengths: list[int], world: int, balance: bool
) -> list[list[int]] | None:
    """Each process's rows as whole prompt groups, equally many per process (balanced by
    the groups' tokens when ``balance``, else in order); ``None`` when the groups differ in
    size or do not split evenly, and rows must be split instead."""
    if len({len(g) for g in groups}) != 1 or len(groups) % world:
        return None
    if balance:
        weights = [sum(lengths[r] for r in g) for g in groups]
        parts = balanced_partitions(weights, world)
    else:
        parts = contiguous_partitions(len(groups), world)
    return [sorted(r for unit in part for r in groups[unit]) for part in parts]
