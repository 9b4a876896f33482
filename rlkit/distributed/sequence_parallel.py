"""Ulysses sequence parallelism: process groups and the differentiable exchanges.

DeepSpeed-Ulysses (Jacobs et al., 2023, arXiv:2309.14509) splits one (packed) sequence of
``N`` tokens across the ``k`` processes of a sequence-parallel group, ``N / k`` tokens
each. Everything but attention acts on tokens one at a time, so each process runs it on
its own slice. Around attention an all-to-all trades the split: each process then holds
``H / k`` of the heads for all ``N`` tokens (:func:`heads_to_sequence`), attends, and a
second all-to-all gives every process its own tokens back with all heads
(:func:`sequence_to_heads`).

The processes form a 2-D grid, ``dp x sp`` (data-parallel x sequence-parallel), row-major:
the ``k`` consecutive ranks ``g k .. g k + k - 1`` are sequence-parallel group ``g`` and
share one data-parallel share of the batch (:class:`SequenceParallel`).

Every exchange here is differentiable: the backward of an all-to-all is the reverse
all-to-all, and the backward of :func:`gather_sequence` keeps the gradient of this
process's own slice. That last rule is right because every process of a group computes
the same loss from the same gathered tensor: the gradient reaching slice ``r`` on process
``r`` is the whole gradient of that slice (nothing is to be summed over the group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkit.distributed.collectives import transport_device, world


class SequenceParallelError(ValueError):
    """A sequence-parallel size the launched processes cannot form groups of."""


@dataclass(frozen=True)
class SequenceParallel:
    """This process's place in the ``dp x sp`` grid.

    Attributes:
        size: ``k``, the processes that split one sequence.
        rank: this process's index in its sequence-parallel group, 0 .. k-1.
        group: the sequence-parallel process group (``None`` when ``size`` is 1).
        dp_rank: the index of this process's group among the data-parallel groups.
        dp_size: the number of data-parallel groups (processes / k).
    """

    size: int
    rank: int
    group: Any
    dp_rank: int
    dp_size: int

    @property
    def enabled(self) -> bool:
        return self.size > 1


def sequence_parallel_problem(size: int, num_processes: int) -> str | None:
    """Why ``size`` cannot split sequences over ``num_processes`` processes, or None."""
    if size < 1:
        return f"ModelConfig.ulysses_sequence_parallel_size must be >= 1, got {size}"
    if num_processes % size:
        return (
            f"ModelConfig.ulysses_sequence_parallel_size = {size} does not divide the "
            f"{num_processes} processes of this run: launch a multiple of {size} processes "
            f"or choose a size that divides {num_processes}"
        )
    return None


def build_sequence_parallel(size: int) -> SequenceParallel:
    """Create the sequence-parallel groups (every process must call this, in the same order).

    Raises:
        SequenceParallelError: ``size`` does not divide the number of processes.
    """
    rank, num = world()
    problem = sequence_parallel_problem(size, num)
    if problem:
        raise SequenceParallelError(problem)
    group = None
    if size > 1:
        for first in range(0, num, size):  # new_group is collective: all create all groups
            ranks = list(range(first, first + size))
            created = dist.new_group(ranks)
            if rank in ranks:
                group = created
    return SequenceParallel(size, rank % size, group, rank // size, num // size)


def _all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``x`` (k, ...): send ``x[j]`` to process j of ``group``; returns (k, ...) with
    ``out[i]`` from process i."""
    moved = x.contiguous().to(transport_device())
    out = torch.empty_like(moved)
    dist.all_to_all_single(out, moved, group=group)
    return out.to(x.device)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # The exchange is a permutation of blocks between processes; its transpose is
        # the same exchange (block j of process i went to block i of process j).
        return _all_to_all(grad, ctx.group), None


def heads_to_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(B, h, n, D) local tokens with all heads -> (B, h / k, n k, D): this process's heads
    for all the group's tokens (process i's tokens at i n .. (i + 1) n - 1)."""
    b, h, n, d = x.shape
    k = sp.size
    blocks = x.reshape(b, k, h // k, n, d).transpose(0, 1)  # (k, B, h/k, n, D): to process j
    got = _AllToAll.apply(blocks, sp.group)  # got[i]: process i's tokens of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // k, k * n, d)


def sequence_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(B, n k, h / k, D) as attention returns it -> (B, n, h, D): this process's own
    tokens with all heads (process i's heads at i h/k .. (i + 1) h/k - 1)."""
    b, total, hk, d = x.shape
    k = sp.size
    blocks = x.reshape(b, k, total // k, hk, d).transpose(0, 1)  # (k, B, n, h/k, D)
    got = _AllToAll.apply(blocks, sp.group)  # got[i]: my tokens of process i's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, total // k, k * hk, d)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp, ctx.n = sp, x.shape[0]
        moved = x.contiguous().to(transport_device())
        parts = [torch.empty_like(moved) for _ in range(sp.size)]
        dist.all_gather(parts, moved, group=sp.group)
        return torch.cat(parts).to(x.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.sp.rank * ctx.n
        return grad[start : start + ctx.n], None


def gather_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(n, ...) this process's slice -> (n k, ...) the whole sequence, in group order.

    Backward keeps the gradient of this process's slice (module docs: every process of
    the group computes the same loss from the gathered tensor)."""
    if not sp.enabled:
        return x
    return _GatherSequence.apply(x, sp)
