"""Loop reference of PPO's clipped value loss (``algorithms.value_loss``)."""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.reference.aggregation_loops import aggregate, grid, masked_mean, valid_positions


def value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    clip: float = 0.5,
    mode: str = "token-mean",
    **n: float | None,
) -> tuple[Tensor, dict[str, float]]:
    """½·agg(max((v − R)², (clip(v, V_old ± clip) − R)²)), token by token.

    Returns:
        The 0-dim loss (autograd gives the reference gradient) and ``vf_clipfrac``.
    """
    rows, length = mask.shape
    loss, clipped = grid(rows, length), grid(rows, length, 0)
    for b, t in valid_positions(mask):
        v, ret, old = vpreds[b, t], returns[b, t], values[b, t]
        v_clip = torch.minimum(torch.maximum(v, old - clip), old + clip)
        l1, l2 = (v - ret) ** 2, (v_clip - ret) ** 2
        clipped[b][t] = float(l2 > l1)
        loss[b][t] = torch.maximum(l1, l2)
    return 0.5 * aggregate(loss, mask, mode, **n), {"vf_clipfrac": masked_mean(clipped, mask)}
