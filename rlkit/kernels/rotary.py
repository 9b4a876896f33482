"""Rotary position embedding kernels: ``x * cos + rotate_half(x) * sin`` (arXiv:2104.09864).

Each implementation has Hugging Face's signature
``(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q_embed, k_embed)``
with q, k of shape (B, heads, S, head_dim) and cos, sin of shape (B, S, head_dim).
HF attention calls ``apply_rotary_pos_emb`` as a *module-level* function of its
modeling module, so a rotary kernel is installed there and applies to every
model of that architecture in the process (see :mod:`rlkit.kernels.patching`).

* ``hf`` - the modeling module's own function (installing it restores the original).
* ``npu_rotary_mul`` - ``torch_npu.npu_rotary_mul`` (Ascend).
* ``liger`` - Liger-Kernel's Triton RoPE (CUDA).
"""

from __future__ import annotations

import torch

from rlkit.kernels.registry import register_kernel


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@register_kernel(
    "rotary", "hf", priority=0, native=True, summary="the modeling module's own function"
)
def hf_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference RoPE (what HF computes); installing ``hf`` restores HF's own function."""
    del position_ids
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@register_kernel(
    "rotary",
    "npu_rotary_mul",
    platforms=("npu",),
    priority=100,
    requires=("torch_npu",),
    summary="torch_npu.npu_rotary_mul (Ascend fused op)",
)
def npu_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_rotary_mul(x, r1, r2) = x * r1 + rotate_half(x) * r2`` applied to q and k."""
    import torch_npu

    del position_ids
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (
        torch_npu.npu_rotary_mul(q.contiguous(), cos, sin),
        torch_npu.npu_rotary_mul(k.contiguous(), cos, sin),
    )


@register_kernel(
    "rotary",
    "liger",
    platforms=("cuda",),
    priority=100,
    requires=("liger_kernel",),
    summary="Liger-Kernel Triton RoPE (arXiv:2410.10989)",
)
def liger_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``liger_kernel.transformers.rope.liger_rotary_pos_emb`` (same signature as HF)."""
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    return liger_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)
