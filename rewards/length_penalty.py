"""Linear length penalty: discourage long responses beyond a target length.

For a response of L tokens, a target length Lt and a maximum length Lmax::

    R(L) = -coef * clip((L - Lt) / (Lmax - Lt), 0, 1)

so responses up to Lt are free, the penalty grows linearly to ``-coef`` at
Lmax and stays there. ``Lt = 0`` penalises every token (``-coef * L / Lmax``).
Unlike DAPO's overlong buffer (:mod:`rewards.overlong`), this is meant as a
gentle pressure towards brevity over the whole range, not a guard at the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewards.response_length import response_length
from rlkit.registry import REWARDS

if TYPE_CHECKING:
    import torch


def _check(max_length: int, target_length: int, coef: float) -> None:
    if not 0 <= target_length < max_length:
        raise ValueError(
            f"need 0 <= target_length < max_length, got target_length={target_length}, "
            f"max_length={max_length}"
        )
    if coef < 0:
        raise ValueError(f"coef must be >= 0 (the penalty is subtracted), got {coef}")


def linear_length_penalty(
    lengths: torch.Tensor, max_length: int, target_length: int = 0, coef: float = 1.0
) -> torch.Tensor:
    """Linear penalty of each response (formula in the module docstring).

    Args:
        lengths: response lengths in tokens, any shape (usually (B,)).
        max_length: Lmax, where the penalty reaches ``-coef``.
        target_length: Lt, the length up to which there is no penalty (``< max_length``).
        coef: the largest penalty.

    Returns:
        The penalties, float32 tensor of the shape of ``lengths``, in ``[-coef, 0]``.
    """
    _check(max_length, target_length, coef)
    excess = lengths.double() - target_length
    # 0 - x rather than -x: no penalty is +0.0, not -0.0.
    return (0.0 - (excess / (max_length - target_length)).clamp(0.0, 1.0) * coef).float()


def length_penalty_value(
    length: int, *, max_length: int, target_length: int = 0, coef: float = 1.0
) -> float:
    """:func:`linear_length_penalty` of one response length, in plain Python.

    Plain floats, not torch: reward calls run under a time limit in processes
    that need not load torch (tests check both forms agree).

    Args:
        length: the response's length in tokens.
        max_length: Lmax.
        target_length: Lt.
        coef: the largest penalty.

    Returns:
        The penalty, a float in ``[-coef, 0]``.
    """
    _check(max_length, target_length, coef)
    ramp = (length - target_length) / (max_length - target_length)
    return 0.0 - min(max(ramp, 0.0), 1.0) * coef


@REWARDS.register("length_penalty", summary="linear penalty from a target length to the maximum")
def length_penalty(
    response: str,
    ground_truth: str = "",
    *,
    max_response_length: int,
    target_length: int = 0,
    coef: float = 1.0,
    **extra: Any,
) -> float:
    """Per-response form of :func:`linear_length_penalty`.

    Args:
        response: the response text (its length comes from ``response_length``).
        ground_truth: unused.
        max_response_length: Lmax in tokens.
        target_length: Lt in tokens.
        coef: the largest penalty.
        **extra: must hold ``response_length``, the response's token count.

    Returns:
        The penalty, in ``[-coef, 0]``.
    """
    return length_penalty_value(
        response_length(extra, "length_penalty"),
        max_length=max_response_length,
        target_length=target_length,
        coef=coef,
    )
