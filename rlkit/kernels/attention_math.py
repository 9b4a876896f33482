"""Scaled dot-product attention with the variants some model families add.

``torch.nn.functional.scaled_dot_product_attention`` computes
``softmax(scale * q k^T + mask) v``. Gemma2 caps the scores first,
``c * tanh(scale * q k^T / c)`` (attention soft-capping), which SDPA cannot express:
:func:`attend` then runs the plain matmul-softmax-matmul, as transformers' eager
attention does, and SDPA otherwise. Every rlkit attention path (the ``grouped_sdpa``
kernel, attention within segments) goes through it, so none of them drops the cap.

On a CPU, attention computes in float32 (:func:`cpu_attention`), also under bf16 autocast,
which would otherwise run SDPA in bf16: SDPA's CPU backward in bf16 took 3.2x its float32
time (``python benchmarks/profile_step.py --mixed-precision bf16`` on a 2-core AMD EPYC
with AVX-512 BF16), and float32 scores err less. A single query per row (a decode step)
runs as two grouped matrix products around a softmax (:func:`single_query_attention`):
SDPA's CPU kernel took a quarter of a bf16 generation there, on bf16 views of the cache.
Plain SDPA (:func:`sdpa_attention`) is the reference both are tested against.
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
    if softcap is not None:
        return softcapped_attention(
            query, key, value, mask, scale=scale, dropout=dropout, softcap=softcap,
            is_causal=is_causal,
        )  # fmt: skip
    if query.device.type == "cpu":
        return cpu_attention(
            query, key, value, mask, scale=scale, dropout=dropout, is_causal=is_causal
        )
    return sdpa_attention(
        query, key, value, mask, scale=scale, dropout=dropout, is_causal=is_causal
    )


def sdpa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on grouped heads (shapes as
    :func:`attend`), in the inputs' dtype or autocast's: the plain version."""
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


def cpu_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """:func:`sdpa_attention` computed in float32 (at least), outside autocast; a single
    query per row through :func:`single_query_attention`. Returns the dtype SDPA would:
    autocast's when it is on, else the query's."""
    autocast = torch.is_autocast_enabled("cpu")
    out_dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
    compute = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    compute = torch.promote_types(compute, torch.float32)
    with torch.autocast("cpu", enabled=False):
        query, key, value = query.to(compute), key.to(compute), value.to(compute)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(compute)  # SDPA takes an additive mask in the query's dtype only
        if query.shape[-2] == 1 and not dropout and not is_causal:
            out = single_query_attention(query, key, value, mask, scale=scale)
        else:
            out = sdpa_attention(
                query, key, value, mask, scale=scale, dropout=dropout, is_causal=is_causal
            )
    return out.to(out_dtype)


def single_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """``softmax(scale * q k^T + mask) v`` for one query per row: (B, H, 1, D) queries,
    (B, H_kv, k, D) keys, (B, H_kv, k, D_v) values; returns (B, H, 1, D_v).

    The ``H / H_kv`` queries that share a key/value head are the rows of one matrix
    product against that head's keys (query head ``h`` reads key head ``h // (H / H_kv)``,
    as SDPA's ``enable_gqa`` does). ``mask``: boolean (``True`` = attend) or additive,
    broadcastable to (B, H, 1, k)."""
    rows, heads, _, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[-2]
    scale = dim**-0.5 if scale is None else scale
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.mT).mul_(scale).reshape(rows, heads, 1, keys)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1).reshape(rows, kv_heads, heads // kv_heads, keys)
    return torch.matmul(probs, value).reshape(rows, heads, 1, value.shape[-1])


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
