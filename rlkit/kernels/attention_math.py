"""Scaled dot-product attention with the variants some model families add.

``torch.nn.functional.scaled_dot_product_attention`` computes
``softmax(scale * q k^T + mask) v``. Gemma2 caps the scores first,
``c * tanh(scale * q k^T / c)`` (attention soft-capping), which SDPA cannot express:
:func:`attend` then runs the plain matmul-softmax-matmul, as transformers' eager
attention does, and SDPA otherwise. Every rlkit attention path (the ``grouped_sdpa``
kernel, attention within segments) goes through it, so none of them drops the cap.
"""

from __future__ import annotations

import torch


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Attention over grouped key/value heads: (B, H, q, D) queries, (B, H_kv, k, D) keys,
    (B, H_kv, k, D_v) values, ``H`` a multiple of ``H_kv``; returns (B, H, q, D_v).

    ``mask``: boolean (``True`` = attend) or additive float, broadcastable to
    (B, H, q, k), or None. ``is_causal`` (no mask) aligns the causal mask top-left, as
    SDPA does. ``softcap``: the score cap ``c`` (None: none; then this is SDPA).
    """
    if softcap is None:
        return torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=dropout,
            scale=scale,
            is_causal=is_causal,
            enable_gqa=key.shape[1] != query.shape[1],
        )
    return softcapped_attention(
        query, key, value, mask, scale=scale, dropout=dropout, softcap=softcap, is_causal=is_causal
    )


def softcapped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None,
    dropout: float,
    softcap: float,
    is_causal: bool = False,
) -> torch.Tensor:
    """``softmax(c * tanh(scale * q k^T / c) + mask) v`` (shapes as :func:`attend`).

    The softmax runs in float32 and a blocked score is the dtype's lowest value rather
    than ``-inf``, as in transformers' eager attention: a query that sees no key gets
    uniform weights, not NaN.
    """
    repeat = query.shape[1] // key.shape[1]
    if repeat > 1:
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    lowest = torch.finfo(scores.dtype).min
    if is_causal and mask is None:
        q, k = scores.shape[-2:]
        mask = torch.ones(q, k, dtype=torch.bool, device=scores.device).tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, lowest)
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.matmul(probs, value)
