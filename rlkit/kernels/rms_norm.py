"""RMSNorm kernels: ``y = w * (x / sqrt(mean(x^2) + eps))`` (arXiv:1910.07467).

Each implementation is ``(module, hidden_states) -> Tensor`` and is bound as the
``forward`` of every Qwen2/Qwen3/Llama RMSNorm instance. They follow the Hugging
Face casting: normalise in float32, cast back to the input dtype, then multiply
by the weight.

* ``hf`` - the module's own forward (nothing patched).
* ``torch_lean`` - plain-torch autograd function that saves only the input and
  the per-row ``1/rms`` (HF's autograd also keeps a float32 copy of the input and
  the normalised activations); opt-in on every platform.
* ``npu_rms_norm`` - ``torch_npu.npu_rms_norm`` (Ascend).
* ``liger`` - Liger-Kernel's Triton RMSNorm (CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlkit.kernels.registry import register_kernel


@register_kernel(
    "rms_norm", "hf", priority=0, native=True, summary="the model's own forward (plain torch)"
)
def hf_rms_norm(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The Hugging Face forward of ``module``'s class (the reference)."""
    return type(module).forward(module, hidden_states)


class _LeanRMSNorm(torch.autograd.Function):
    """RMSNorm saving (x, 1/rms) only; the gradient is computed analytically.

    With ``xhat = x * r``, ``r = (mean(x^2) + eps)^-1/2`` and ``gn = g * w``:
    ``dL/dx = r * (gn - xhat * mean(gn * xhat))`` and ``dL/dw = sum(g * xhat)``.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        xf = x.to(torch.float32)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(torch.float32) * rstd
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            per_row = grad_out * xhat.to(x.dtype)
            grad_w = per_row.reshape(-1, per_row.shape[-1]).sum(0).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            grad_n = (grad_out * weight).to(torch.float32)
            mean_term = (grad_n * xhat).mean(-1, keepdim=True)
            grad_x = (rstd * (grad_n - xhat * mean_term)).to(x.dtype)
        return grad_x, grad_w, None


@register_kernel(
    "rms_norm",
    "torch_lean",
    priority=-10,
    summary="plain-torch autograd saving only x and 1/rms (opt-in; any platform)",
)
def torch_lean_rms_norm(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """RMSNorm through :class:`_LeanRMSNorm`."""
    return _LeanRMSNorm.apply(hidden_states, module.weight, module.variance_epsilon)


@register_kernel(
    "rms_norm",
    "npu_rms_norm",
    platforms=("npu",),
    priority=100,
    requires=("torch_npu",),
    summary="torch_npu.npu_rms_norm (Ascend fused op)",
)
def npu_rms_norm(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_rms_norm(x, w, epsilon)[0]`` (it also returns ``1/rms``)."""
    if module.weight.dtype != hidden_states.dtype:
        # The NPU op needs gamma and x in one dtype; HF would promote instead.
        return hf_rms_norm(module, hidden_states)
    import torch_npu

    return torch_npu.npu_rms_norm(hidden_states, module.weight, epsilon=module.variance_epsilon)[0]


@register_kernel(
    "rms_norm",
    "liger",
    platforms=("cuda",),
    priority=100,
    requires=("liger_kernel",),
    summary="Liger-Kernel Triton RMSNorm, Llama casting (arXiv:2410.10989)",
)
def liger_rms_norm(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``LigerRMSNormFunction`` with the Llama casting mode (offset 0, not in place)."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(
        hidden_states, module.weight, module.variance_epsilon, 0.0, "llama", False
    )
