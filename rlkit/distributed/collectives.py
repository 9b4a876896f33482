"""Cross-process exchange over the default process group (identity with one process).

Used by the trainer (rollouts and per-row tensors), the HF rollout engine (FSDP
lock-step) and the SGLang engine (server URLs, weight-sync paths). The trainer
keeps the whole global batch on every process (as verl's single controller does),
so advantages, group filters and metrics are computed on the global batch
identically everywhere; only forward/backward passes are sharded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def transport_device(backend: str | None = None) -> torch.device:
    """Where tensors must be to travel over ``backend`` (default: the default group's).

    gloo moves CPU tensors; nccl/hccl only move tensors on the accelerator.
    """
    if (backend or dist.get_backend()) == "gloo":
        return torch.device("cpu")
    from rlkit.device import current

    return current().device()


def broadcast_object(obj: Any) -> Any:
    """``obj`` from the main process (rank 0), on every process."""
    _, size = world()
    if size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every process (nothing to wait for with one process)."""
    if world()[1] > 1:
        dist.barrier()


def gather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order, on every process."""
    _, size = world()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's rows (equal shapes required) in rank order."""
    _, size = world()
    if size == 1:
        return tensor
    local = tensor.contiguous().to(transport_device())
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local)
    return torch.cat(parts, dim=0).to(tensor.device)


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}
"""Reduce op names -> ``dist.ReduceOp`` members; ``mean`` is a sum divided afterwards
(gloo has no AVG)."""


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce over every process; returns the tensor (the input itself).

    Args:
        tensor: any shape; with ``mean`` a floating-point one.
        op: ``"sum"``, ``"mean"`` (the sum divided by the process count), ``"max"`` or
            ``"min"``.

    Raises:
        ValueError: an unknown ``op``.
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; choose one of {tuple(_REDUCE_OPS)}")
    _, size = world()
    if size > 1:
        moved = tensor.to(transport_device())
        dist.all_reduce(moved, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
        if op == "mean":
            moved = moved / size
        tensor.copy_(moved)
    return tensor


def same_everywhere(value: int, op: str = "max") -> int:
    """An integer agreed by all processes (their max or min)."""
    return int(all_reduce(torch.tensor([value], dtype=torch.long), op).item())
