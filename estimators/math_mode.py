"""Which implementation of the estimators' scans runs: the plain loop or the fused scan.

Discounted sums over time (GAE, the discounted returns of REINFORCE++ and ReMax) have
a **plain** implementation: the textbook ``for t in reversed(range(T))`` loop, in
the estimator's own module (``gae_advantages`` in ``estimators/gae.py``,
``discounted_returns`` in ``estimators/discounted_returns.py``), which a debugger
steps through token by token. Beside each sits a fused one with the same signature
(valid tokens packed to the front of each row, then a chunked-matmul scan:
``estimators/discounted_scan.py``, ``estimators/valid_token_compaction.py``), which
``benchmarks/estimators.py`` showed to be much faster and which runs by default.
The estimators with such a pair are listed in :data:`FUSED_PATHS`; the others are
vectorised torch with no loop over time and have only one implementation.

Select the plain math for the whole process, or for a block::

    estimators.set_math("plain")
    with estimators.plain_math():
        advantages, returns = estimators.get("gae")(rewards, mask, values=values)

The choice is read on every call, so it also reaches a trainer that has already
looked its estimator up in the registry. It is process-wide state (not per thread).
``algorithms`` has the same switch for the policy losses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

#: The implementations one can select: ``fused`` (the default: the fused scan where an
#: estimator has one) and ``plain`` (always the loop over time).
MATH_MODES = ("fused", "plain")
#: Registered estimators that have a fused scan beside their plain loop.
FUSED_PATHS = ("gae", "reinforce_plus_plus", "remax")

_selected = "fused"

Implementation = TypeVar("Implementation", bound=Callable[..., object])


def set_math(mode: str) -> None:
    """Select ``"plain"`` or ``"fused"`` math for every later estimator call of this process.

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
