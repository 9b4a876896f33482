"""Validation of the arguments every policy loss shares.

All policy losses have one signature (see ``algorithms.losses``); these checks
make a wrong shape, an out-of-range clip bound or a misspelt option fail loudly
instead of training on garbage.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable, Mapping

from torch import Tensor


def check_inputs(
    loss_name: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_is_weights: Tensor | None,
) -> None:
    """Raise ValueError unless all (B, T) inputs share one 2-D shape."""
    named = {
        "old_log_prob": old_log_prob,
        "log_prob": log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
    }
    if rollout_is_weights is not None:
        named["rollout_is_weights"] = rollout_is_weights
    shapes = {name: tuple(t.shape) for name, t in named.items()}
    if len(set(shapes.values())) != 1 or len(shapes["log_prob"]) != 2:
        raise ValueError(f"{loss_name}: all inputs must share one (B, T) shape; got {shapes}")
    if not log_prob.is_floating_point():
        raise TypeError(f"{loss_name}: log_prob must be a float tensor, got {log_prob.dtype}")


def clip_bounds(
    clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    """(ε_low, ε_high): the decoupled bounds, each defaulting to ``clip_ratio``.

    Raises:
        ValueError: a bound is negative or not finite.
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    for name, value in (("clip_ratio_low", low), ("clip_ratio_high", high)):
        if not (_is_number(value) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(low), float(high)


def check_range(
    loss_name: str,
    name: str,
    value: float,
    *,
    low: float,
    high: float = math.inf,
    low_inclusive: bool = False,
) -> float:
    """Raise ValueError unless ``value`` lies in (low, high] ([low, high] if inclusive)."""
    ok = _is_number(value) and value <= high
    ok = ok and (value >= low if low_inclusive else value > low)
    if not ok:
        opening = "[" if low_inclusive else "("
        raise ValueError(f"{loss_name}: {name} must be in {opening}{low}, {high}], got {value!r}")
    return float(value)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def reject_unknown_options(
    loss_name: str, options: Mapping[str, object], known: Iterable[str] = ()
) -> None:
    """Raise TypeError naming any option the loss does not take.

    A misspelt option in a gin config (``kl_cov_ration=...``) must not be
    silently ignored.
    """
    if not options:
        return
    known = sorted(known)
    parts = []
    for key in sorted(options):
        near = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    takes = ", ".join(known) if known else "no loss-specific options"
    raise TypeError(
        f"policy loss {loss_name!r} got unknown option(s) {', '.join(parts)}; it takes: "
        f"{takes} (plus the common loss_agg_mode, clip_ratio, clip_ratio_low, "
        f"clip_ratio_high, clip_ratio_c, rollout_is_weights, num_tokens, num_seqs, norm_length)"
    )
