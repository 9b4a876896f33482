"""Attention kernels, selected through the model's ``config._attn_implementation``.

Hugging Face models look their attention function up by that name in
``ALL_ATTENTION_FUNCTIONS`` at every forward, so choosing a kernel means setting
the name (``model.set_attn_implementation``); no model code is patched. Each
implementation is ``(model) -> None``.

* ``eager`` - HF's matmul-softmax-matmul reference.
* ``sdpa`` - ``torch.nn.functional.scaled_dot_product_attention`` (any platform).
* ``grouped_sdpa`` - the same function on the grouped key/value heads as they are
  (``enable_gqa``), also under a padding mask, where transformers' ``sdpa`` first copies
  every key and value head once per query head (``repeat_kv``): on CPU, where SDPA takes
  masked grouped heads, this saves copying the whole KV cache at every decoded token.
* ``flash_attention_2`` - the ``flash-attn`` package (CUDA, fp16/bf16 models).
* ``npu_fusion_attention`` - ``torch_npu.npu_fusion_attention``, reached through
  transformers' NPU flash-attention integration (on Ascend, transformers routes
  ``"flash_attention_2"`` to ``transformers.integrations.npu_flash_attention``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlkit.kernels.attention_math import attend
from rlkit.kernels.registry import register_kernel
from rlkit.kernels.segmented_attention import SEGMENTS_KWARG
from rlkit.kernels.shared_prefix_decode import SHARED_PREFIX_KWARG, shared_prefix_attention

#: The name :func:`grouped_sdpa_attention` is registered under in transformers.
GROUPED_SDPA = "rlkit_grouped_sdpa"


def set_attention_implementation(model: nn.Module, name: str) -> None:
    """Make ``model`` (and its sub-models) use attention implementation ``name``.

    Raises:
        ValueError: ``model`` has no Hugging Face ``config``.
    """
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    elif hasattr(model, "config"):
        model.config._attn_implementation = name
    else:
        raise ValueError(
            f"cannot select an attention kernel for {type(model).__name__}: it has no Hugging "
            f"Face config; pass a transformers PreTrainedModel"
        )


@register_kernel("attention", "eager", priority=0, summary="HF eager attention (reference)")
def eager_attention(model: nn.Module) -> None:
    """Select HF's eager attention."""
    set_attention_implementation(model, "eager")


def _has_sdpa(platform: object) -> str | None:
    del platform
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return None
    return "this PyTorch has no scaled_dot_product_attention"


@register_kernel(
    "attention",
    "sdpa",
    priority=50,
    check=_has_sdpa,
    summary="torch scaled_dot_product_attention (any platform)",
)
def sdpa_attention(model: nn.Module) -> None:
    """Select torch SDPA."""
    set_attention_implementation(model, "sdpa")


def grouped_sdpa_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: SDPA over ``key``/``value`` with their own
    (fewer) heads. query (B, H, q, D), key (B, H_kv, k, D) and value (B, H_kv, k, D_v),
    ``attention_mask`` as transformers' ``sdpa_mask`` builds it (boolean (B, 1, q, k) or
    None); returns (B, q, H, D_v). Everything else is transformers' ``sdpa`` (``sdpa_attention_forward``),
    which it calls for the inputs it does not handle (a position bias, a paged cache).

    A packed row's :class:`~rlkit.kernels.segmented_attention.AttentionSegments`, passed
    to the decoder as the keyword ``rlkit_attention_segments``, replace the mask:
    attention then runs within each segment under its own mask.

    A decode step over a shared-prefix KV cache passes a
    :data:`~rlkit.kernels.shared_prefix_decode.PrefixReader` as ``rlkit_shared_prefix``:
    ``key``/``value`` are then the rows' own tokens, and the group's prompt is read from
    the cache once per group (:func:`shared_prefix_attention`).

    The layer's ``softcap`` (Gemma2's attention soft-capping), which transformers' ``sdpa``
    ignores, is applied on every path (:func:`~rlkit.kernels.attention_math.attend`). Its
    ``sliding_window`` narrows the segments' masks; on the other paths transformers has
    already built it into ``attention_mask``.
    """
    softcap = kwargs.get("softcap")
    segments = kwargs.get(SEGMENTS_KWARG)
    if segments is not None:
        out = segments.attend(
            query,
            key,
            value,
            dropout=dropout,
            scale=scaling,
            window=kwargs.get("sliding_window"),
            softcap=softcap,
        )
        return out, None
    read_prefix = kwargs.get(SHARED_PREFIX_KWARG)
    if read_prefix is not None:
        prefix = read_prefix(module.layer_idx)
        out = shared_prefix_attention(query, prefix, key, value, attention_mask, scaling, softcap)
        return out, None
    if kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # As transformers' sdpa: the causal flag only for a maskless multi-token query (a
    # single decoded token attends to the whole cache).
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = attend(
        query,
        key,
        value,
        attention_mask,
        scale=scaling,
        dropout=dropout,
        softcap=softcap,
        is_causal=causal,
    )
    return out.transpose(1, 2).contiguous(), None


def _register_grouped_sdpa() -> None:
    """Make :data:`GROUPED_SDPA` a transformers attention implementation, with sdpa's masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def _takes_masked_grouped_heads(platform: object) -> str | None:
    missing = _has_sdpa(platform)
    if missing:
        return missing
    try:
        # SDPA's CPU kernels take grouped heads under a mask (CUDA's fall back to the
        # math kernel then, so the copy of plain sdpa is cheaper there).
        q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 2, 4)
        mask = torch.ones(1, 1, 1, 2, dtype=torch.bool)
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=True)
    except (TypeError, RuntimeError) as exc:
        return f"this PyTorch's SDPA does not take masked grouped heads ({exc})"
    return None


@register_kernel(
    "attention",
    "grouped_sdpa",
    platforms=("cpu",),
    priority=60,
    check=_takes_masked_grouped_heads,
    summary="torch SDPA on the grouped key/value heads (no repeat_kv copy; CPU)",
)
def grouped_sdpa_attention(model: nn.Module) -> None:
    """Select :func:`grouped_sdpa_forward`."""
    _register_grouped_sdpa()
    set_attention_implementation(model, GROUPED_SDPA)


@register_kernel(
    "attention",
    "flash_attention_2",
    platforms=("cuda",),
    priority=100,
    requires=("flash_attn",),
    summary="flash-attn 2 (CUDA; fp16/bf16 models; arXiv:2307.08691)",
)
def flash_attention_2(model: nn.Module) -> None:
    """Select flash-attn 2."""
    set_attention_implementation(model, "flash_attention_2")


@register_kernel(
    "attention",
    "npu_fusion_attention",
    platforms=("npu",),
    priority=100,
    requires=("torch_npu", "transformers.integrations.npu_flash_attention"),
    summary="torch_npu.npu_fusion_attention via transformers' NPU flash-attention",
)
def npu_fusion_attention(model: nn.Module) -> None:
    """Select ``flash_attention_2``, which transformers serves with ``npu_fusion_attention``."""
    set_attention_implementation(model, "flash_attention_2")
