"""Chunked log-prob + entropy with recomputation: peak memory bounded by one chunk.

The (tokens x vocab) logits are the largest activation of LLM RL: 8k tokens x
152k vocab in float32 is 5 GB, and ``log_softmax`` makes another. Here the
tokens are processed ``chunk_size`` rows at a time. The forward pass keeps only
three numbers per token (``log p(label)``, entropy, log-sum-exp); the backward
pass recomputes each chunk's logits from the hidden states and applies the
analytic gradient of :mod:`rlkit.kernels.softmax_stats`, so no (tokens x vocab)
tensor ever exists. The price is one extra ``hidden @ W^T`` per chunk in the
backward pass.

The loop over chunks is the stated chunked scan; everything inside a chunk is
vectorised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rlkit.kernels.softmax_stats import block_grad_, block_stats_

#: ``(z, labels, compute_entropy, scratch) -> (log_p, entropy | None, lse)``; may
#: overwrite ``z`` and ``scratch`` (see :func:`rlkit.kernels.softmax_stats.block_stats_`).
BlockStats = Callable[..., tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the softmax statistics: float32 for 16-bit inputs, else the input's."""
    return torch.promote_types(dtype, torch.float32)


def _chunks(n: int, chunk_size: int) -> list[slice]:
    return [slice(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


class _Workspace:
    """Two (chunk x vocab) buffers reused by every chunk (no per-chunk allocation)."""

    def __init__(self, rows: int, vocab: int, like: torch.Tensor, dtype: torch.dtype) -> None:
        self.z = like.new_empty(rows, vocab, dtype=dtype)
        self.scratch = like.new_empty(rows, vocab, dtype=dtype)

    def views(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows.stop - rows.start
        return self.z[:n], self.scratch[:n]


def _tempered_logits_into(
    out: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    if out.dtype == hidden.dtype:
        torch.mm(hidden, weight.t(), out=out)
        if bias is not None:
            out.add_(bias)
    else:  # 16-bit matmul, statistics in float32
        out.copy_(F.linear(hidden, weight, bias))
    return out.div_(temperature) if temperature != 1.0 else out


class _LinearLogProbs(torch.autograd.Function):
    """Autograd function of :func:`linear_logprobs_chunked` (recomputes in backward)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
        compute_entropy: bool,
        stats: BlockStats,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx.set_materialize_grads(False)
        dtype = compute_dtype(hidden.dtype)
        n = hidden.shape[0]
        log_p = hidden.new_empty(n, dtype=dtype)
        lse = hidden.new_empty(n, dtype=dtype)
        entropy = hidden.new_empty(n, dtype=dtype) if compute_entropy else None
        work = _Workspace(min(chunk_size, n), weight.shape[0], hidden, dtype)
        for rows in _chunks(n, chunk_size):
            z, scratch = work.views(rows)
            _tempered_logits_into(z, hidden[rows], weight, bias, temperature)
            log_p[rows], ent, lse[rows] = stats(z, labels[rows], compute_entropy, scratch)
            if entropy is not None:
                entropy[rows] = ent
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return log_p, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_p: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        none_rest = (None,) * 5
        if grad_log_p is None and grad_entropy is None:
            return (None, None, None, *none_rest)
        # 16-bit weights: accumulate the chunk sum in float32, cast once at the end.
        acc = compute_dtype(weight.dtype)
        # Contiguous (not empty_like): its row blocks are written with mm(out=...).
        grad_hidden = hidden.new_empty(hidden.shape) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_weight else None
        )
        grad_bias = (
            torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_bias else None
        )
        n = hidden.shape[0]
        work = _Workspace(min(ctx.chunk_size, n), weight.shape[0], hidden, lse.dtype)
        for rows in _chunks(n, ctx.chunk_size):
            z, scratch = work.views(rows)
            _tempered_logits_into(z, hidden[rows], weight, bias, ctx.temperature)
            grad_z = block_grad_(
                z,
                labels[rows],
                lse[rows],
                None if entropy is None else entropy[rows],
                None if grad_log_p is None else grad_log_p[rows],
                None if grad_entropy is None else grad_entropy[rows],
                scratch,
            )
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            grad_logits = grad_z.to(weight.dtype)
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if grad_weight is not None:
                if acc == weight.dtype:
                    grad_weight.addmm_(grad_logits.t(), hidden[rows])
                else:
                    grad_weight += (grad_logits.t() @ hidden[rows]).to(acc)
            if grad_bias is not None:
                grad_bias += grad_z.sum(0).to(acc)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return (grad_hidden, grad_weight, grad_bias, *none_rest)


def linear_logprobs_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
    stats: BlockStats = block_stats_,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax((hidden @ W^T + b) / T)[label]`` and entropy, ``chunk_size`` rows at a time.

    Inputs are assumed validated (see :func:`rlkit.ops.token_logprobs_and_entropy`).

    Args:
        hidden: (N, H) final hidden states.
        weight: (V, H) LM-head weight (same dtype as ``hidden``).
        bias: (V,) LM-head bias or ``None``.
        labels: (N,) int64 token ids in ``[0, V)``.
        temperature: sampling temperature T > 0 dividing the logits.
        chunk_size: rows per chunk; the workspace is two (chunk_size x V) buffers
            of the compute dtype, reused by every chunk.
        compute_entropy: also return the entropy (skipped in both passes if False).
        stats: the per-block statistics function (a platform kernel may supply a
            fused one; the backward pass is always the analytic one).

    Returns:
        log_p: (N,) log-probability of each label, float32 (float64 for float64 inputs).
        entropy: (N,) entropy of each token's distribution, or ``None``.
    """
    return _LinearLogProbs.apply(
        hidden, weight, bias, labels, temperature, chunk_size, compute_entropy, stats
    )


class _LogitsLogProbs(torch.autograd.Function):
    """Autograd function of :func:`logits_logprobs_chunked`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
        compute_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx.set_materialize_grads(False)
        dtype = compute_dtype(logits.dtype)
        n = logits.shape[0]
        log_p = logits.new_empty(n, dtype=dtype)
        lse = logits.new_empty(n, dtype=dtype)
        entropy = logits.new_empty(n, dtype=dtype) if compute_entropy else None
        work = _Workspace(min(chunk_size, n), logits.shape[1], logits, dtype)
        for rows in _chunks(n, chunk_size):
            z, scratch = work.views(rows)
            z.copy_(logits[rows]).div_(temperature)
            log_p[rows], ent, lse[rows] = block_stats_(z, labels[rows], compute_entropy, scratch)
            if entropy is not None:
                entropy[rows] = ent
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return log_p, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_p: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        logits, labels, lse, entropy = ctx.saved_tensors
        if grad_log_p is None and grad_entropy is None:
            return (None,) * 5
        grad_logits = torch.empty_like(logits)
        n = logits.shape[0]
        work = _Workspace(min(ctx.chunk_size, n), logits.shape[1], logits, lse.dtype)
        for rows in _chunks(n, ctx.chunk_size):
            z, scratch = work.views(rows)
            z.copy_(logits[rows]).div_(ctx.temperature)
            grad_z = block_grad_(
                z,
                labels[rows],
                lse[rows],
                None if entropy is None else entropy[rows],
                None if grad_log_p is None else grad_log_p[rows],
                None if grad_entropy is None else grad_entropy[rows],
                scratch,
            )
            grad_logits[rows] = grad_z.div_(ctx.temperature)
        return (grad_logits, None, None, None, None)


def logits_logprobs_chunked(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)[label]`` and entropy from given logits.

    Saves only the logits (which the caller holds anyway) plus three numbers per
    row; ``log_softmax`` is never materialised.

    Args:
        logits: (N, V) logits.
        labels: (N,) int64 ids in ``[0, V)``.
        temperature: T > 0.
        chunk_size: rows per chunk of the workspace.
        compute_entropy: also return the entropy.

    Returns:
        log_p: (N,) float32 (float64 for float64 logits).
        entropy: (N,) or ``None``.
    """
    return _LogitsLogProbs.apply(logits, labels, temperature, chunk_size, compute_entropy)
