"""Loop reference of the KL penalties (``algorithms.kl``), one token at a time."""

from __future__ import annotations

import math


def kl(logp: float, ref: float, kind: str) -> float:
    """One token's KL penalty value (forward value only; ``k3+`` etc. as their kind).

    Args:
        logp: log π(y_t); ref: log π_ref(y_t).
        kind: ``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl`` (a trailing
            ``+`` is the straight-through form, whose value is the named kind's).

    Returns:
        The penalty (k3 clamps the log-ratio to ±20 and the value to ±10, as verl).
    """
    kind = kind.rstrip("+")
    d = logp - ref
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("k2", "mse"):
        return 0.5 * d * d
    if kind in ("k3", "low_var_kl"):
        k = min(max(ref - logp, -20.0), 20.0)
        return min(max(math.expm1(k) - k, -10.0), 10.0)
    raise ValueError(kind)
