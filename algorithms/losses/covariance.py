"""Token-level covariance between advantage and log-probability.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv:2505.22617): the change of policy entropy is driven by
cov(log π(y_t), A_t); ``kl_cov`` and ``clip_cov`` act on the tokens with the
largest per-token covariance (A − mean A)·(log π − mean log π), the means taken
over the valid tokens of the micro-batch (as in verl).
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.aggregation import masked_mean


@torch.no_grad()
def token_covariance(advantages: Tensor, log_prob: Tensor, weights: Tensor) -> Tensor:
    """(A − mean A)·(log π − mean log π) per token, (B, T); detached.

    Args:
        advantages: (B, T) A, finite everywhere.
        log_prob: (B, T) log π_θ, finite everywhere (use ``safe_log_prob``).
        weights: (B, T) the mask as float token weights; the means are over the
            valid tokens (weighted, as verl's ``masked_mean``).

    Returns:
        (B, T) covariance terms; values at padding are meaningless (mask them).
    """
    advantages, log_prob = advantages.detach(), log_prob.detach()
    mean_adv = masked_mean(advantages, weights, padding_finite=True)
    mean_log_prob = masked_mean(log_prob, weights, padding_finite=True)
    return (advantages - mean_adv).mul_(log_prob - mean_log_prob)


#: Below this many entries a plain ``torch.topk`` is as fast as the prefilter.
_DIRECT_TOPK = 1 << 16
_CHUNK = 1024


def top_k_indices(scores: Tensor, k: int) -> Tensor:
    """Flat indices of the ``k`` largest entries of ``scores`` (any shape).

    Ties are broken towards the smaller flat index (row-major order), so the
    choice is deterministic (``torch.topk`` leaves it unspecified). Exact, and
    faster than ``torch.topk`` on millions of entries with small k: the k-th
    largest of the per-chunk maxima is a lower bound of the k-th largest entry,
    so only entries above it are ranked.

    Args:
        scores: tensor of any shape; ``-inf`` entries are never chosen if k does
            not exceed the number of finite ones.
        k: how many, 0 <= k <= scores.numel().

    Returns:
        (k,) int64 indices into ``scores.reshape(-1)``, largest first.
    """
    flat = scores.reshape(-1)
    if k <= 0:
        return flat.new_zeros(0, dtype=torch.long)
    n_chunks = -(-flat.numel() // _CHUNK)
    if flat.numel() <= _DIRECT_TOPK or k > n_chunks:
        return _stable_top(flat, torch.arange(flat.numel(), device=flat.device), k)
    padded = torch.nn.functional.pad(flat, (0, n_chunks * _CHUNK - flat.numel()), value=-torch.inf)
    chunk_max = padded.view(n_chunks, _CHUNK).amax(dim=1)
    threshold = torch.topk(chunk_max, k).values[-1]
    # Every entry equal to the k-th largest value is >= threshold, so ties survive.
    candidates = torch.nonzero(flat >= threshold).squeeze(1)
    return _stable_top(flat[candidates], candidates, k)


def _stable_top(values: Tensor, indices: Tensor, k: int) -> Tensor:
    # ``indices`` ascend, and a stable descending sort keeps that order among ties.
    order = torch.sort(values, descending=True, stable=True).indices[:k]
    return indices[order]
