"""Decode-step attention that reads each group's shared prompt once (cascade attention).

An RL rollout decodes ``n`` responses to each prompt. After a shared prefill the KV cache
usually holds each prompt's keys and values ``n`` times, and every decode step reads all
``n`` copies: on a CPU a decode step's attention is bound by that memory traffic. Here the
cache holds each group's prompt once, ``(G, H_kv, P, D)``, and each row's own response
tokens apart, ``(B, H_kv, t, D)``. One decode step then computes, for the query ``q`` of
row ``r`` in group ``g`` (Ye et al. 2024, "Cascade inference", FlashInfer; vLLM's cascade
attention)::

    s_prompt = q · K_g^T,   s_own = q · K_r^T                         (scores)
    p = softmax(scale · [s_prompt, s_own] + mask)                    (one softmax)
    out = p_prompt · V_g + p_own · V_r

which is exactly ``softmax(scale · q K^T + mask) V`` over the row's concatenated keys: the
same sums in another order. The prompt's products run per group, with the queries of the
group's ``n`` rows (and, under grouped-query attention, each key/value head's query heads)
stacked as the rows of one matrix, so each prompt key and value is read once per group.

Rows that stopped leave the batch; :attr:`SharedPrefix.rows` then says which of the
group's ``n`` slots each remaining row occupies, and the empty slots compute zeros that
are never read. :func:`reference_shared_prefix_attention` is the plain computation: copy
each row's prompt keys beside its own, one SDPA call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlkit.kernels.attention_math import attend

#: Keyword under which the decode loop passes a :data:`PrefixReader` through the model's
#: forward to its attention function (transformers forwards extra keywords to it).
SHARED_PREFIX_KWARG = "rlkit_shared_prefix"


@dataclass(frozen=True)
class SharedPrefix:
    """One layer's prompt keys and values, held once per group of ``n`` rows.

    Attributes:
        keys: (G, H_kv, P, D) prompt keys of each group (left padding masked by the
            attention mask's first ``P`` columns).
        values: (G, H_kv, P, D).
        n: rows per group when the prompts were repeated.
        rows: (B,) long, the slot ``g * n + j`` of each row still in the batch, in batch
            order; ``None`` while all ``G * n`` rows are there in order.
    """

    keys: torch.Tensor
    values: torch.Tensor
    n: int
    rows: torch.Tensor | None = None

    def slots(self) -> torch.Tensor:
        """(B,) the slot of each row (``arange(G * n)`` while no row has left)."""
        if self.rows is not None:
            return self.rows
        return torch.arange(self.keys.shape[0] * self.n, device=self.keys.device)


PrefixReader = Callable[[int], SharedPrefix]
"""layer index -> that layer's :class:`SharedPrefix` (the cache marks it read)."""


def _per_group(x: torch.Tensor, prefix: SharedPrefix, kv_heads: int) -> torch.Tensor:
    """(B, H, X) per row -> (G, H_kv, n * H / H_kv, X): each group's rows stacked per KV head."""
    groups, n = prefix.keys.shape[0], prefix.n
    if prefix.rows is not None:  # stopped rows' slots stay zero
        x = x.new_zeros(groups * n, *x.shape[1:]).index_copy_(0, prefix.rows, x)
    heads, width = x.shape[1], x.shape[2]
    x = x.reshape(groups, n, kv_heads, heads // kv_heads, width).transpose(1, 2)
    return x.reshape(groups, kv_heads, n * heads // kv_heads, width)


def _per_row(x: torch.Tensor, prefix: SharedPrefix) -> torch.Tensor:
    """The inverse of :func:`_per_group`: (G, H_kv, n * H / H_kv, X) -> (B, H, X)."""
    groups, kv_heads, stacked, width = x.shape
    n = prefix.n
    x = x.reshape(groups, kv_heads, n, stacked // n, width).transpose(1, 2)
    x = x.reshape(groups * n, kv_heads * stacked // n, width)
    return x if prefix.rows is None else x.index_select(0, prefix.rows)


def shared_prefix_attention(
    query: torch.Tensor,
    prefix: SharedPrefix,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """One decode step's attention over each row's shared prompt and its own tokens.

    Args:
        query: (B, H, 1, D), one decoded token per row.
        prefix: the rows' prompt keys and values, once per group.
        keys: (B, H_kv, t, D), each row's own tokens so far (the current one included).
        values: (B, H_kv, t, D).
        mask: boolean (B, 1, 1, P + t) (``True`` = attend) or additive float of that
            shape, over the prompt's ``P`` positions then the row's ``t``; ``None``
            attends everywhere.
        scale: score scale; ``None`` is ``D ** -0.5``.
        softcap: the score cap ``c`` of ``c * tanh(scores / c)`` (Gemma2), or None.

    Returns:
        (B, 1, H, D_v): the attention output in transformers' layout (``D_v``: the
        values' head size, which multi-head latent attention makes differ from ``D``).
    """
    tokens = query.shape[2]
    if tokens != 1:
        raise ValueError(f"shared-prefix attention decodes one token per row, got {tokens}")
    with torch.autocast(query.device.type, enabled=False):
        out = _attend(query[:, :, 0], prefix, keys, values, mask, scale, softcap)
    return out.to(values.dtype)[:, None]


def _attend(q, prefix, keys, values, mask, scale, softcap=None) -> torch.Tensor:
    """(B, H, D) queries -> (B, H, D_v) outputs, scores and softmax at least in float32.

    bf16 / fp16 inputs are upcast first: SDPA keeps its scores in float32 too, and scores
    rounded to bf16 before the softmax would err about twice as much as SDPA does."""
    compute = torch.promote_types(q.dtype, torch.float32)
    q, keys, values = q.to(compute), keys.to(compute), values.to(compute)
    prompt_keys, prompt_values = prefix.keys.to(compute), prefix.values.to(compute)
    rows, heads, dim = q.shape
    kv_heads, prompt = prompt_keys.shape[1], prompt_keys.shape[2]
    scale = dim**-0.5 if scale is None else scale
    prompt_scores = _per_row(torch.matmul(_per_group(q, prefix, kv_heads), prompt_keys.mT), prefix)
    own = q.reshape(rows, kv_heads, heads // kv_heads, dim)
    own_scores = torch.matmul(own, keys.mT).reshape(rows, heads, -1)
    scores = torch.cat([prompt_scores, own_scores], dim=-1).mul_(scale)
    if softcap is not None:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    if mask is not None:
        mask = mask.reshape(rows, 1, -1)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        else:
            scores = scores.add_(mask)
    probs = torch.softmax(scores, dim=-1)
    prompt_out = torch.matmul(_per_group(probs[..., :prompt], prefix, kv_heads), prompt_values)
    own_probs = probs[..., prompt:].reshape(rows, kv_heads, heads // kv_heads, -1)
    own_out = torch.matmul(own_probs, values).reshape(rows, heads, values.shape[-1])
    return _per_row(prompt_out, prefix) + own_out


def reference_shared_prefix_attention(
    query: torch.Tensor,
    prefix: SharedPrefix,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """:func:`shared_prefix_attention` computed plainly: each row's prompt keys and values
    copied beside its own, one attention call. Same arguments and result."""
    group = prefix.slots() // prefix.n
    full_keys = torch.cat([prefix.keys[group], keys], dim=2)
    full_values = torch.cat([prefix.values[group], values], dim=2)
    out = attend(query, full_keys, full_values, mask, scale=scale, softcap=softcap)
    return out.transpose(1, 2)
