"""Kernel registry: per op, implementations per platform; the best available one runs.

Ops: ``rms_norm``, ``rotary``, ``swiglu``, ``attention`` (installed into a loaded
Hugging Face model by :func:`apply_kernels`) and ``logprobs`` (chosen at each call
of :func:`rlkit.ops.token_logprobs_and_entropy`).

    from rlkit.kernels import apply_kernels, choose
    apply_kernels(model)                          # {"rms_norm": "hf", ...}
    choose("attention", platform="cpu")           # KernelChoice("grouped_sdpa", "...")
    apply_kernels(model, overrides={"attention": "eager"})

See docs/devices.md for the table of kernels and which ran on real hardware.
"""

from rlkit.kernels.patching import MODEL_OPS, apply_kernels
from rlkit.kernels.registry import (
    ANY_PLATFORM,
    KERNEL_OPS,
    KernelSpec,
    UnknownOpError,
    op_registry,
    register_kernel,
)
from rlkit.kernels.selection import (
    KernelChoice,
    KernelStatus,
    KernelUnavailableError,
    choose,
    configured_overrides,
    describe,
    set_overrides,
)

__all__ = [
    "ANY_PLATFORM",
    "KERNEL_OPS",
    "MODEL_OPS",
    "KernelChoice",
    "KernelSpec",
    "KernelStatus",
    "KernelUnavailableError",
    "UnknownOpError",
    "apply_kernels",
    "choose",
    "configured_overrides",
    "describe",
    "op_registry",
    "register_kernel",
    "set_overrides",
]
