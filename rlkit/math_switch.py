"""A process-wide choice between the plain and the fused implementation of some math.

``algorithms`` (policy losses) and ``estimators`` (advantage estimators) each hold one
:class:`MathSwitch`: their functions ask it on every call which implementation to run,
so a choice also reaches code that looked a function up before it was made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

#: ``fused`` (the default: the fused path where one is kept) and ``plain`` (always the
#: plain-torch math).
MATH_MODES = ("fused", "plain")

Implementation = TypeVar("Implementation", bound=Callable[..., object])


class MathSwitch:
    """The selected mode of one family of functions (``what`` names it in errors)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.mode = "fused"

    def set(self, mode: str) -> None:
        """Select ``"plain"`` or ``"fused"`` for every later call in this process.

        Raises:
            ValueError: ``mode`` is not one of :data:`MATH_MODES`.
        """
        if mode not in MATH_MODES:
            raise ValueError(f"{self.what} math mode must be one of {MATH_MODES}, got {mode!r}")
        self.mode = mode

    def get(self) -> str:
        """The selected mode: ``"fused"`` (the default) or ``"plain"``."""
        return self.mode

    @contextmanager
    def use(self, mode: str) -> Iterator[None]:
        """Run the block with ``mode``, then restore the previous mode (even on error)."""
        previous = self.mode
        self.set(mode)
        try:
            yield
        finally:
            self.mode = previous

    def plain(self) -> AbstractContextManager[None]:
        """``with switch.plain():`` runs the block with the plain math."""
        return self.use("plain")

    def choose(self, plain: Implementation, fused: Implementation) -> Implementation:
        """``plain`` when the plain math is selected, else ``fused`` (same signature)."""
        return plain if self.mode == "plain" else fused
