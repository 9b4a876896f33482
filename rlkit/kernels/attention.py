"""Attention kernels, selected through the model's ``config._attn_implementation``.

Hugging Face models look their attention function up by that name in
``ALL_ATTENTION_FUNCTIONS`` at every forward, so choosing a kernel means setting
the name (``model.set_attn_implementation``); no model code is patched. Each
implementation is ``(model) -> None``.

* ``eager`` - HF's matmul-softmax-matmul reference.
* ``sdpa`` - ``torch.nn.functional.scaled_dot_product_attention`` (any platform).
* ``flash_attention_2`` - the ``flash-attn`` package (CUDA, fp16/bf16 models).
* ``npu_fusion_attention`` - ``torch_npu.npu_fusion_attention``, reached through
  transformers' NPU flash-attention integration (on Ascend, transformers routes
  ``"flash_attention_2"`` to ``transformers.integrations.npu_flash_attention``).
"""

from __future__ import annotations

import torch
from torch import nn

from rlkit.kernels.registry import register_kernel


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
