"""Per-row softmax statistics of a block of logits and their analytic gradient.

For tempered logits ``z = logits / T`` of one block of rows:

* ``lse = logsumexp(z)``,
* ``log p(y) = z_y - lse``,
* ``H = -sum_v p_v log p_v``.

Gradient w.r.t. ``z`` (``g_lp``, ``g_H`` are the upstream gradients per row)::

    d log p(y) / dz = onehot(y) - p
    d H / dz        = -p * (log p + H)
    grad_z          = g_lp * onehot(y) - p * (g_lp + g_H * (log p + H))

Both functions work in place in two (rows x vocab) buffers, ``z`` and
``scratch``, so a chunk costs exactly two such buffers and a caller can reuse
them across chunks (:mod:`rlkit.kernels.chunked_logprobs` does).
"""

from __future__ import annotations

import torch

#: Where log-probs are floored: exp() of it is exactly 0 in float32 and float64, so a
#: floored entry is one with p = 0, and its product with a gradient stays finite.
LOG_P_FLOOR = -1e4


def _floor_log_probs_(log_p: torch.Tensor) -> torch.Tensor:
    # p = 0 entries (z = -inf) must contribute 0 to p*log p, not 0 * -inf = NaN. The floor
    # is not the dtype's most negative number: the backward multiplies it by the entropy's
    # upstream gradient before p, and -3.4e38 * g overflows to inf for |g| > 1 (inf * 0 =
    # NaN).
    return log_p.clamp_(min=LOG_P_FLOOR)


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    # A row that is entirely -inf has no distribution; 0 keeps z - x at -inf, not NaN.
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


def block_stats_(
    z: torch.Tensor,
    labels: torch.Tensor,
    compute_entropy: bool,
    scratch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-prob of the label, entropy and log-sum-exp of each row.

    Args:
        z: (rows, vocab) tempered logits in the compute dtype (float32/float64);
            overwritten (becomes workspace).
        labels: (rows,) int64 token ids in ``[0, vocab)``.
        compute_entropy: whether to compute the entropy.
        scratch: (rows, vocab) buffer like ``z`` to work in, or ``None`` to allocate.

    Returns:
        log_p: (rows,) ``log p(label)``.
        entropy: (rows,) entropy of each row's distribution, or ``None``.
        lse: (rows,) log-sum-exp of each row (needed by :func:`block_grad_`).
    """
    if scratch is None:
        scratch = torch.empty_like(z)
    row_max = _finite_or_zero(z.amax(-1, keepdim=True))
    shifted_exp = torch.sub(z, row_max, out=scratch).exp_()
    total = shifted_exp.sum(-1, keepdim=True)
    lse = _finite_or_zero((total.log() + row_max).squeeze(-1))
    log_p = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not compute_entropy:
        return log_p, None, lse
    p = shifted_exp.div_(total.clamp_(min=torch.finfo(z.dtype).tiny))
    log_q = _floor_log_probs_(z.sub_(lse.unsqueeze(-1)))
    entropy = -p.mul_(log_q).sum(-1)
    return log_p, entropy, lse


def block_grad_(
    z: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    grad_log_p: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient w.r.t. the tempered logits ``z`` of one block.

    Args:
        z: (rows, vocab) tempered logits, recomputed; overwritten.
        labels: (rows,) int64 label ids.
        lse: (rows,) log-sum-exp from :func:`block_stats_`.
        entropy: (rows,) entropy from :func:`block_stats_` (needed if ``grad_entropy``).
        grad_log_p: (rows,) upstream gradient of ``log p(label)``, or ``None`` for zero.
        grad_entropy: (rows,) upstream gradient of the entropy, or ``None`` for zero.
        scratch: (rows, vocab) buffer like ``z`` that receives the result, or ``None``.

    Returns:
        (rows, vocab) gradient w.r.t. ``z`` (``scratch`` if given).
    """
    log_q = _floor_log_probs_(z.sub_(lse.unsqueeze(-1)))
    p = torch.exp(log_q, out=scratch) if scratch is not None else log_q.exp()
    if grad_entropy is not None:
        # p * (g_lp + g_H * (log p + H)), built in place in the log_q buffer.
        coef = log_q.add_(entropy.unsqueeze(-1)).mul_(grad_entropy.unsqueeze(-1))
        if grad_log_p is not None:
            coef.add_(grad_log_p.unsqueeze(-1))
        p.mul_(coef)
    elif grad_log_p is not None:
        p.mul_(grad_log_p.unsqueeze(-1))
    else:
        return p.zero_()
    grad = p.neg_()
    if grad_log_p is not None:
        grad.scatter_add_(-1, labels.unsqueeze(-1), grad_log_p.unsqueeze(-1).to(grad.dtype))
    return grad
