"""Which implementation of the policy-loss math runs: the plain one or a fused one.

Every policy loss has a **plain** implementation: a few lines of torch in the loss's
own module that read like the paper's equations, whose gradient is autograd's, and
that a debugger steps through line by line (``vanilla_terms`` in
``algorithms/losses/vanilla.py`` is PPO's clip). Where ``benchmarks/losses.py``
showed a fused implementation to be meaningfully faster (at least 1.2x at 64 x
1,024 and 512 x 4,096 tokens), it is kept beside the plain one with the same
signature, in ``algorithms/losses/fused.py``, and runs by default; the losses with
one are listed in :data:`FUSED_PATHS`. Every other loss always runs its plain math.

Select the plain math for the whole process, or for a block::

    algorithms.set_math("plain")
    with algorithms.plain_math():
        loss, metrics = algorithms.get_loss("vanilla")(old, new, advantages, mask)

The choice is read on every call of a loss, so it also reaches a trainer that has
already looked its loss up in the registry. It is process-wide state (not per
thread). ``estimators`` has the same switch for the advantage estimators.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

#: The implementations one can select: ``fused`` (the default: the fused path where a
#: loss has one, else the plain one) and ``plain`` (always the plain one).
MATH_MODES = ("fused", "plain")
#: Registered policy losses that have a fused path beside their plain math.
FUSED_PATHS = ("clip_cov", "geo_mean", "gspo", "vanilla")

_selected = "fused"

Implementation = TypeVar("Implementation", bound=Callable[..., object])


def set_math(mode: str) -> None:
    """Select ``"plain"`` or ``"fused"`` math for every later loss call of this process.

    Raises:
        ValueError: ``mode`` is not one of :data:`MATH_MODES`.
    """
    global _selected
    if mode not in MATH_MODES:
        raise ValueError(f"math mode must be one of {MATH_MODES}, got {mode!r}")
    _selected = mode


def get_math() -> str:
    """The selected mode: ``"fused"`` (the default) or ``"plain"``."""
    return _selected


@contextmanager
def use_math(mode: str) -> Iterator[None]:
    """Run the block with ``mode``'s math, then restore the previous mode (even on error).

    Raises:
        ValueError: ``mode`` is not one of :data:`MATH_MODES`.
    """
    previous = _selected
    set_math(mode)
    try:
        yield
    finally:
        set_math(previous)


def plain_math() -> AbstractContextManager[None]:
    """``with plain_math():`` runs the block with the plain math (``use_math("plain")``)."""
    return use_math("plain")


def choose(plain: Implementation, fused: Implementation) -> Implementation:
    """``plain`` when the plain math is selected, else ``fused`` (same signature)."""
    return plain if _selected == "plain" else fused
