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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

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
