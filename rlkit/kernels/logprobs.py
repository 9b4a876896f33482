"""Log-prob + entropy kernels behind :func:`rlkit.ops.token_logprobs_and_entropy`.

Each implementation is ``(hidden (N,H), weight (V,H), bias (V,) | None, labels (N,),
*, temperature, chunk_size, compute_entropy) -> (log_p (N,), entropy (N,) | None)``.

* ``chunked`` - plain-torch chunked scan with recomputation in backward
  (:mod:`rlkit.kernels.chunked_logprobs`); peak memory bounded by the chunk.
* ``naive`` - full logits + ``log_softmax`` (the reference and benchmark baseline).
* ``npu_cross_entropy`` - the chunked scan with each chunk's forward statistics
  from ``torch_npu.npu_cross_entropy_loss`` (Ascend); backward is the analytic
  plain-torch one.
"""

from __future__ import annotations

import torch

from rlkit.kernels.chunked_logprobs import linear_logprobs_chunked
from rlkit.kernels.naive_logprobs import naive_linear_logprobs
from rlkit.kernels.registry import register_kernel
from rlkit.kernels.softmax_stats import block_stats_


@register_kernel(
    "logprobs",
    "chunked",
    priority=50,
    summary="chunked fused LM-head + log-softmax, recomputed in backward (any platform)",
)
def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`rlkit.kernels.chunked_logprobs.linear_logprobs_chunked` with torch statistics."""
    return linear_logprobs_chunked(
        hidden,
        weight,
        bias,
        labels,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
    )


register_kernel(
    "logprobs",
    "naive",
    priority=0,
    summary="full logits + log_softmax (reference; tokens x vocab memory)",
)(naive_linear_logprobs)


def _npu_block_stats(
    z: torch.Tensor,
    labels: torch.Tensor,
    compute_entropy: bool,
    scratch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    # npu_cross_entropy_loss(input (N,C), target (N,), reduction="none") returns
    # (loss = -log p(target), log_prob = log_softmax(input) (N,C), zloss, lse_for_zloss).
    if z.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return block_stats_(z, labels, compute_entropy, scratch)
    import torch_npu

    loss, log_prob, _, _ = torch_npu.npu_cross_entropy_loss(z, labels, reduction="none")
    log_p = -loss.to(z.dtype)
    lse = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_p
    if not compute_entropy:
        return log_p, None, lse
    log_q = log_prob.to(z.dtype).clamp_(min=torch.finfo(z.dtype).min)
    return log_p, -log_q.exp().mul_(log_q).sum(-1), lse


@register_kernel(
    "logprobs",
    "npu_cross_entropy",
    platforms=("npu",),
    priority=100,
    requires=("torch_npu",),
    summary="chunked scan with torch_npu.npu_cross_entropy_loss statistics (Ascend)",
)
def npu_cross_entropy_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked scan whose per-chunk forward uses ``npu_cross_entropy_loss``."""
    return linear_logprobs_chunked(
        hidden,
        weight,
        bias,
        labels,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
        stats=_npu_block_stats,
    )
