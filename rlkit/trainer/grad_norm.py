"""Gradient clipping by the global L2 norm, over gradients on different process meshes.

Under FSDP2 every gradient is a ``DTensor`` on one mesh; with tensor parallelism the
split parameters live on the 2-D ``dp x tp`` mesh and the replicated ones (norms, a value
head) on the ``dp`` axis alone, and torch's fused norm cannot mix the two. The norm is
therefore taken per (mesh, placements) group, each group's DTensor norm reduced over its
own mesh (a replicated gradient counts once, a sharded one sums its shards), and the
squares added::

    ||g|| = sqrt(sum_groups ||g_group||^2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor


def _group_key(grad: torch.Tensor) -> tuple[object, ...]:
    if isinstance(grad, DTensor):
        return ("dtensor", grad.device_mesh, grad.placements, grad.dtype)
    return ("plain", grad.device, grad.dtype)


def total_grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``params``' gradients, the same on every process (float32 scalar).

    Args:
        params: parameters whose ``.grad`` is set (plain tensors or DTensors).
    """
    groups: dict[tuple[object, ...], list[torch.Tensor]] = {}
    for param in params:
        groups.setdefault(_group_key(param.grad), []).append(param.grad)
    squares = torch.zeros((), dtype=torch.float64)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares = squares + norm.detach().cpu().double() ** 2
    return squares.sqrt().float()


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients in place to a global L2 norm of at most ``max_norm``.

    Returns:
        The norm before clipping (``inf``/``nan`` as found; the gradients are then left as
        they are, for the caller to skip the step).
    """
    norm = total_grad_norm(params)
    if math.isfinite(float(norm)):
        # torch's clip_grads_with_norm_ arithmetic, in float32; a Python scalar multiplies
        # a DTensor gradient on any mesh.
        coef = float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        if coef < 1.0:
            for param in params:
                param.grad.mul_(coef)
    return norm
