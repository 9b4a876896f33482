"""KL coefficient controllers for the KL-in-reward penalty (β in r − β·KL).

* :class:`FixedKLController`: β never changes.
* :class:`AdaptiveKLController`: Ziegler et al. 2019 (arXiv:1909.08593), as in
  verl: β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n_steps / horizon).

Both are tiny stateful objects with ``state_dict`` / ``load_state_dict`` so a
resumed run continues with the same β.
"""

from __future__ import annotations

import math
from typing import Any

#: verl's bound on the proportional error of the adaptive controller.
PROPORTIONAL_ERROR_BOUND = 0.2


def _finite(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {need}, got {value}")
    return value


class FixedKLController:
    """A constant KL coefficient.

    Args:
        kl_coef: β >= 0.

    Attributes:
        value: the current β.
    """

    kind = "fixed"

    def __init__(self, kl_coef: float) -> None:
        self.value = _finite("kl_coef", kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers are used the same way)."""

    def state_dict(self) -> dict[str, Any]:
        """The controller's state: ``{"kind", "value"}``."""
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (raises ValueError for another kind)."""
        _check_kind(state, self.kind)
        self.value = _finite("value", state["value"])

    def __repr__(self) -> str:
        return f"FixedKLController(kl_coef={self.value})"


class AdaptiveKLController:
    """Proportional controller steering the measured KL towards ``target_kl``.

    Args:
        init_kl_coef: initial β >= 0.
        target_kl: the KL to track, > 0.
        horizon: steps over which a 20 % error changes β by 20 %, > 0.

    Attributes:
        value: the current β.
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        self.value = _finite("init_kl_coef", init_kl_coef)
        self.target = _finite("target_kl", target_kl, positive=True)
        self.horizon = _finite("horizon", horizon, positive=True)

    def update(self, current_kl: float, n_steps: int) -> None:
        """β ← β·(1 + clip(current_kl/target − 1, ±0.2)·n_steps/horizon).

        Args:
            current_kl: the batch's mean KL (a Python float).
            n_steps: samples (or steps) the measurement covers, >= 0.

        Raises:
            ValueError: non-finite ``current_kl`` (a NaN would poison β forever)
                or negative ``n_steps``.
        """
        current_kl = float(current_kl)
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        error = current_kl / self.target - 1.0
        error = min(max(error, -PROPORTIONAL_ERROR_BOUND), PROPORTIONAL_ERROR_BOUND)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """The controller's state: ``{"kind", "value", "target", "horizon"}``."""
        return {
            "kind": self.kind,
            "value": self.value,
            "target": self.target,
            "horizon": self.horizon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (raises ValueError for another kind)."""
        _check_kind(state, self.kind)
        self.value = _finite("value", state["value"])
        self.target = _finite("target", state["target"], positive=True)
        self.horizon = _finite("horizon", state["horizon"], positive=True)

    def __repr__(self) -> str:
        return (
            f"AdaptiveKLController(value={self.value}, target_kl={self.target}, "
            f"horizon={self.horizon})"
        )


def _check_kind(state: dict[str, Any], kind: str) -> None:
    if state.get("kind", kind) != kind:
        raise ValueError(f"cannot load a {state['kind']!r} KL controller state into a {kind!r} one")


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(
    kind: str = "fixed",
    kl_coef: float = 0.001,
    target_kl: float = 0.1,
    horizon: float = 10000,
) -> KLController:
    """Build a KL controller (verl's defaults: 0.001, 0.1, 10000).

    Args:
        kind: ``"fixed"`` or ``"adaptive"``.
        kl_coef: β (the initial β for ``adaptive``).
        target_kl: target KL (``adaptive`` only).
        horizon: horizon (``adaptive`` only).

    Returns:
        A :class:`FixedKLController` or :class:`AdaptiveKLController`.

    Raises:
        ValueError: unknown ``kind`` or out-of-range numbers.
    """
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller kind {kind!r}; choose 'fixed' or 'adaptive'")
