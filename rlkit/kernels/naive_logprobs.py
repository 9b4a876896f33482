"""The textbook log-prob + entropy: full logits, ``log_softmax``, gather.

It materialises (tokens x vocab) logits and their ``log_softmax`` and lets
autograd save both; it is the reference the chunked kernel is tested against and
the baseline of ``benchmarks/logprobs.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlkit.kernels.chunked_logprobs import compute_dtype


def naive_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each label and entropy of ``softmax((hidden @ W^T + b) / T)``.

    Args:
        hidden: (N, H) hidden states.
        weight: (V, H) LM-head weight.
        bias: (V,) bias or ``None``.
        labels: (N,) int64 ids in ``[0, V)``.
        temperature: T > 0.
        chunk_size: ignored (accepted so all ``logprobs`` kernels share one signature).
        compute_entropy: also return the entropy.

    Returns:
        log_p: (N,) ``log p(label)``, float32 (float64 for float64 inputs).
        entropy: (N,) ``-sum_v p_v log p_v``, or ``None``.
    """
    del chunk_size
    logits = F.linear(hidden, weight, bias).to(compute_dtype(hidden.dtype))
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.log_softmax(-1)
    del logits  # autograd keeps log_probs only; do not hold a second copy
    log_p = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if compute_entropy else None
    return log_p, entropy
