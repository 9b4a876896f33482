"""DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13).

For a response of L tokens, a maximum length Lmax and a buffer of Lb tokens::

    R(L) = 0                                  if L <= Lmax - Lb
         = -(L - (Lmax - Lb)) / Lb * factor   if Lmax - Lb < L <= Lmax
         = -factor                            if L > Lmax

added to the correctness reward. The paper uses Lmax = 20480, Lb = 4096 and
factor 1. verl computes the middle line without the cap (responses longer than
Lmax cannot occur there); the cap keeps the penalty bounded for any input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewards.response_length import response_length
from rlkit.registry import REWARDS

if TYPE_CHECKING:
    import torch


def _check(max_length: int, buffer_length: int, penalty_factor: float) -> None:
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"need 0 < buffer_length <= max_length, got buffer_length={buffer_length}, "
            f"max_length={max_length}"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0 (it is subtracted), got {penalty_factor}")


def overlong_buffer_penalty(
    lengths: torch.Tensor, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO overlong penalty of each response (formula in the module docstring).

    Args:
        lengths: response lengths in tokens, any shape (usually (B,)).
        max_length: Lmax, the maximum response length.
        buffer_length: Lb, the width of the linear ramp before Lmax.
        penalty_factor: the penalty at and beyond Lmax.

    Returns:
        The penalties, float32 tensor of the shape of ``lengths``, in ``[-penalty_factor, 0]``.
    """
    _check(max_length, buffer_length, penalty_factor)
    excess = lengths.double() - (max_length - buffer_length)
    # 0 - x rather than -x: no penalty is +0.0, not -0.0.
    return (0.0 - (excess / buffer_length).clamp(0.0, 1.0) * penalty_factor).float()


def overlong_penalty(
    length: int, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> float:
    """:func:`overlong_buffer_penalty` of one response length, in plain Python.

    Plain floats, not torch: reward calls run under a time limit in processes
    that need not load torch (tests check both forms agree).

    Args:
        length: the response's length in tokens.
        max_length: Lmax.
        buffer_length: Lb.
        penalty_factor: the penalty at and beyond Lmax.

    Returns:
        The penalty, a float in ``[-penalty_factor, 0]``.
    """
    _check(max_length, buffer_length, penalty_factor)
    ramp = (length - (max_length - buffer_length)) / buffer_length
    return 0.0 - min(max(ramp, 0.0), 1.0) * penalty_factor


@REWARDS.register("overlong_buffer", paper="arXiv:2503.14476", summary="DAPO soft overlong penalty")
def overlong_buffer(
    response: str,
    ground_truth: str = "",
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
    **extra: Any,
) -> float:
    """Per-response form of :func:`overlong_buffer_penalty`.

    Args:
        response: the response text (its length comes from ``response_length``).
        ground_truth: unused.
        max_response_length: Lmax in tokens.
        buffer_length: Lb in tokens.
        penalty_factor: the penalty at and beyond Lmax.
        **extra: must hold ``response_length``, the response's token count.

    Returns:
        The penalty, in ``[-penalty_factor, 0]``.
    """
    return overlong_penalty(
        response_length(extra, "overlong_buffer"),
        max_length=max_response_length,
        buffer_length=buffer_length,
        penalty_factor=penalty_factor,
    )
