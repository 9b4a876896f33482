"""The AdamW the trainer builds for its actor, critic and PRM, and which kernel steps it.

PyTorch's AdamW has three implementations of the same update (Loshchilov & Hutter,
arXiv:1711.05101): a loop over the parameters (PyTorch's default on CPU), ``foreach``
(one multi-tensor op per stage, its default on CUDA) and ``fused`` (one kernel per
parameter group). They differ in float rounding only, and in cost: on CPU the loop
takes about five times as long as the fused kernel for a 31.7M-parameter model
(``benchmarks/optimizer_step.py``). The default, ``"torch"``, keeps PyTorch's own
choice, so a run's numbers do not move with rlkit's version; ``"fused"`` is the fast one
where PyTorch ships its kernel (CPU and CUDA).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlkit.trainer.config import OPTIMIZER_IMPLEMENTATIONS

FUSED_DEVICE_TYPES = frozenset({"cpu", "cuda"})
"""Device types with PyTorch's fused AdamW kernel (an accelerator's plug-in backend may
or may not register one, so ``"fused"`` is refused there before any step)."""


def implementation_options(params: list[torch.Tensor], implementation: str) -> dict[str, bool]:
    """The ``fused`` / ``foreach`` keywords of ``torch.optim.AdamW`` for ``implementation``.

    Raises:
        ValueError: an unknown ``implementation``, or ``"fused"`` for parameters that are
            not floating point or live outside CPU and CUDA.
    """
    if implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ValueError(
            "OptimConfig.optimizer_implementation must be one of "
            f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}; got {implementation!r}"
        )
    if implementation == "fused":
        unfit = sorted(
            {
                f"{p.device.type} {p.dtype}"
                for p in params
                if p.device.type not in FUSED_DEVICE_TYPES or not p.dtype.is_floating_point
            }
        )
        if unfit:
            raise ValueError(
                "OptimConfig.optimizer_implementation='fused' needs floating-point parameters "
                f"on CPU or CUDA; these are {', '.join(unfit)}. Use 'torch' or 'foreach'"
            )
    return {
        "torch": {},
        "fused": {"fused": True},
        "foreach": {"foreach": True},
        "for_loop": {"foreach": False},
    }[implementation]


def adamw(
    params: Iterable[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    implementation: str = "torch",
) -> torch.optim.AdamW:
    """AdamW over the parameters of ``params`` that require gradients, stepped by
    ``implementation`` (:data:`~rlkit.trainer.config.OPTIMIZER_IMPLEMENTATIONS`)."""
    trainable = [p for p in params if p.requires_grad]
    return torch.optim.AdamW(
        trainable,
        lr=lr,
        betas=betas,
        weight_decay=weight_decay,
        **implementation_options(trainable, implementation),
    )
