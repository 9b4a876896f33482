"""SwiGLU MLP kernels: ``down(silu(gate(x)) * up(x))`` (arXiv:2002.05202).

Each implementation is ``(module, x) -> Tensor`` and is bound as the ``forward``
of every Qwen2/Qwen3/Llama MLP whose activation is SiLU. The three projections
are always the module's own ``nn.Linear`` layers (so LoRA-wrapped or quantised
layers keep working); only the activation-and-product is replaced.

* ``hf`` - the module's own forward.
* ``torch_lean`` - autograd function saving only ``gate(x)`` and ``up(x)`` and
  recomputing ``silu`` in the backward pass (autograd also keeps ``silu(gate)``);
  opt-in on every platform.
* ``npu_swiglu`` - ``torch_npu.npu_swiglu`` on ``cat(gate, up)`` (Ascend).
* ``liger`` - Liger-Kernel's Triton ``silu(a) * b`` (CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlkit.kernels.registry import register_kernel


@register_kernel("swiglu", "hf", priority=0, native=True, summary="the model's own forward")
def hf_swiglu(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Hugging Face forward of ``module``'s class (the reference)."""
    return type(module).forward(module, x)


class _LeanSiluMul(torch.autograd.Function):
    """``silu(a) * b`` saving (a, b) only.

    With ``s = sigmoid(a)``: ``d/db = silu(a) = a s`` and
    ``d/da = b * s * (1 + a (1 - s))``.
    """

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        dtype = torch.promote_types(gate.dtype, torch.float32)
        a, b, g = gate.to(dtype), up.to(dtype), grad_out.to(dtype)
        s = torch.sigmoid(a)
        grad_up = g * a * s
        grad_gate = g * b * s * (1 + a * (1 - s))
        return grad_gate.to(gate.dtype), grad_up.to(up.dtype)


@register_kernel(
    "swiglu",
    "torch_lean",
    priority=-10,
    summary="plain-torch autograd recomputing silu in backward (opt-in; any platform)",
)
def torch_lean_swiglu(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP with :class:`_LeanSiluMul` between the projections."""
    return module.down_proj(_LeanSiluMul.apply(module.gate_proj(x), module.up_proj(x)))


@register_kernel(
    "swiglu",
    "npu_swiglu",
    platforms=("npu",),
    priority=100,
    requires=("torch_npu",),
    summary="torch_npu.npu_swiglu on cat(gate, up) (Ascend fused op)",
)
def npu_swiglu(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``npu_swiglu`` splits its input in halves A, B along ``dim`` and returns silu(A) * B."""
    import torch_npu

    gate_up = torch.cat((module.gate_proj(x), module.up_proj(x)), dim=-1)
    return module.down_proj(torch_npu.npu_swiglu(gate_up, dim=-1))


@register_kernel(
    "swiglu",
    "liger",
    platforms=("cuda",),
    priority=100,
    requires=("liger_kernel",),
    summary="Liger-Kernel Triton silu(a)*b (arXiv:2410.10989)",
)
def liger_swiglu(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP with ``LigerSiLUMulFunction`` between the projections."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return module.down_proj(LigerSiLUMulFunction.apply(module.gate_proj(x), module.up_proj(x)))
