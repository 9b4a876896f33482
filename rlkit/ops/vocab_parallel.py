"""Per-token log-probabilities and entropies from logits whose vocabulary is split over
processes (a vocabulary-parallel LM head, as tensor parallelism splits it).

Each process holds the logits of its vocabulary slice ``[vocab_start, vocab_start + V_i)``
for every token. With ``z = logits / T`` the statistics need only three all-reduces of
one number per token, never the full (tokens x vocab) logits::

    m    = max_v z_v                   (all-reduce max)
    s    = sum_v exp(z_v - m)          (all-reduce sum)        lse = m + log s
    z_y  = the label's logit           (all-reduce sum: one process owns it)
    E[z] = sum_v exp(z_v - lse) z_v    (all-reduce sum)
    log p(y) = z_y - lse               H = lse - E[z]

The backward pass is local to each slice (Megatron-LM's vocabulary-parallel cross entropy
does the same for the loss; Shoeybi et al. 2019, arXiv:1909.08053)::

    d log p(y) / d z_v = [v = y] - p_v          d H / d z_v = -p_v (z_v - E[z])

and ``d/d logits = d/d z / T``. :func:`gathered_logprobs_and_entropy` is the plain twin:
it gathers the slices and calls :func:`~rlkit.ops.logprobs.logprobs_and_entropy_from_logits`
(tests compare the two).

:func:`vocab_parallel_token_logprobs` starts from the hidden states and this process's rows
of the LM head (tensor parallelism's split head): ``chunk_size`` tokens at a time, it forms
the local logits (tokens x V_i), takes the statistics above, and recomputes the chunk in
the backward pass, so neither the full nor the local logits of all tokens are ever held.
Every process holds the same hidden states and each slice's gradient reaches them, so
their gradient is summed over the processes (Megatron-LM's "copy to the tensor-parallel
region": identity forward, all-reduce backward).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from rlkit.ops.logprobs import logprobs_and_entropy_from_logits


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


class _VocabParallelStats(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        vocab_start: int,
        temperature: float,
        group: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        z = logits.to(dtype) / temperature
        m = _all_reduce(z.max(dim=-1).values, dist.ReduceOp.MAX, group)
        shifted = torch.exp(z - m.unsqueeze(-1))
        lse = m + torch.log(_all_reduce(shifted.sum(dim=-1), dist.ReduceOp.SUM, group))
        local = labels - vocab_start
        owned = (local >= 0) & (local < z.shape[-1])
        picked = z.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        z_label = _all_reduce(torch.where(owned, picked, 0.0), dist.ReduceOp.SUM, group)
        p = torch.exp(z - lse.unsqueeze(-1))
        # 0 * -inf is nan: a masked logit (-inf) contributes nothing to E[z].
        pz = torch.where(p > 0, p * z, 0.0)
        mean_z = _all_reduce(pz.sum(dim=-1), dist.ReduceOp.SUM, group)
        ctx.save_for_backward(z, lse, mean_z, local, owned)
        ctx.temperature = temperature
        ctx.input_dtype = logits.dtype
        return z_label - lse, lse - mean_z

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_p: torch.Tensor, grad_entropy: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        z, lse, mean_z, local, owned = ctx.saved_tensors
        p = torch.exp(z - lse.unsqueeze(-1))
        grad = -p * grad_log_p.unsqueeze(-1)
        centered = torch.where(p > 0, z - mean_z.unsqueeze(-1), 0.0)
        grad = grad - p * centered * grad_entropy.unsqueeze(-1)
        rows = owned.nonzero(as_tuple=True)
        grad[(*rows, local[rows])] += grad_log_p[rows]
        return (grad / ctx.temperature).to(ctx.input_dtype), None, None, None, None


def vocab_parallel_logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    temperature: float = 1.0,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(label)`` and the entropy of ``softmax(logits / T)`` over the whole
    vocabulary, from this process's vocabulary slice (module docstring).

    Args:
        logits: (..., V_i) this process's slice of the logits; gradients flow to it.
        labels: (...) token ids in the whole vocabulary ``[0, V)``.
        vocab_start: the first vocabulary id of this slice.
        temperature: T > 0.
        group: the process group the vocabulary is split over (default: the world).

    Returns:
        log_probs: (...) float32 (float64 for float64 logits), the same on every process.
        entropy: (...) likewise.

    Raises:
        ValueError: a non-positive temperature, or labels and logits that do not line up.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels of shape {tuple(labels.shape)} for logits of shape {tuple(logits.shape)}: "
            f"one label per row of logits"
        )
    return _VocabParallelStats.apply(logits, labels.long(), int(vocab_start), temperature, group)


def gathered_logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain twin of :func:`vocab_parallel_logprobs_and_entropy`: every process's slice
    gathered (in rank order) into the full logits, then the unsplit op. Slices may differ
    in width; gradients flow back to this process's slice."""
    widths = [torch.zeros((), dtype=torch.long) for _ in range(dist.get_world_size(group))]
    dist.all_gather(widths, torch.tensor(logits.shape[-1]), group=group)
    widest = int(max(w.item() for w in widths))
    padded = torch.nn.functional.pad(logits, (0, widest - logits.shape[-1]))
    parts = [torch.empty_like(padded) for _ in widths]
    dist.all_gather(parts, padded.detach().contiguous(), group=group)
    rank = dist.get_rank(group)
    parts[rank] = padded  # this slice keeps its autograd history
    full = torch.cat([part[..., : int(w)] for part, w in zip(parts, widths)], dim=-1)
    log_p, entropy = logprobs_and_entropy_from_logits(full, labels, temperature=temperature)
    return log_p, entropy


class _SumGradients(torch.autograd.Function):
    """Identity forward; the gradient summed over ``group`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def vocab_parallel_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
    bias: torch.Tensor | None = None,
    logit_softcap: float | None = None,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(label)`` and entropy of ``softmax((hidden @ W^T + b) / T)`` over the whole
    vocabulary, from this process's rows of ``W`` (module docstring).

    Args:
        hidden: (..., H) the same on every process of ``group``; gradients flow to it.
        weight: (V_i, H) this process's rows of the LM head, ids ``vocab_start ..``.
        labels: (...) token ids in the whole vocabulary.
        vocab_start: the first vocabulary id of this process's rows.
        temperature: T > 0.
        chunk_size: tokens per chunk.
        compute_entropy: also return the entropy.
        bias: (V_i,) this process's slice of the head's bias, or ``None``.
        logit_softcap: Gemma2's ``c``: logits ``c * tanh(z / c)``, as the model computes.
        group: the process group the vocabulary is split over.

    Returns:
        log_probs: (...) float32, the same on every process.
        entropy: (...) float32, or ``None`` without ``compute_entropy``.
    """
    lead = hidden.shape[:-1]
    flat = _SumGradients.apply(hidden.reshape(-1, hidden.shape[-1]), group)
    flat_labels = labels.reshape(-1).long()

    def chunk_stats(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.nn.functional.linear(h, weight, bias)
        if logit_softcap is not None:
            logits = torch.tanh(logits / logit_softcap) * logit_softcap
        return vocab_parallel_logprobs_and_entropy(
            logits, y, vocab_start=vocab_start, temperature=temperature, group=group
        )

    parts = [
        checkpoint(chunk_stats, h, y, use_reentrant=False)
        for h, y in zip(flat.split(chunk_size), flat_labels.split(chunk_size))
    ]
    log_p = torch.cat([p[0] for p in parts]).reshape(lead)
    entropy = torch.cat([p[1] for p in parts]).reshape(lead) if compute_entropy else None
    return log_p, entropy
