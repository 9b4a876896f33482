"""A warning when rollout and training disagree on the policy's log-probs.

The importance ratios of PPO-style losses assume the trainer's forward computes the
distribution the rollout sampled from. ``rollout/logprob_abs_diff_mean``, the mean
``|log pi_train - log pi_rollout|`` over a step's response tokens, measures how far
apart they are. At step 1 the weights are the same on both sides, so anything beyond
float rounding is a mismatch of computation: another dtype, a kernel, an attention
feature one side drops (a sliding window, soft-capping), or sampling settings the
engine does not apply to its log-probs. Later steps can grow it legitimately (an
asynchronous engine, off-policy mini-batches), so after step 1 the guard warns only when
the value jumps: above the bound and more than :data:`JUMP` times the largest value seen.
A batch sampled by older weights (``async/staleness/max > 0``, ``rollout_mode =
"one_step_off"``) differs by design and is not checked.

Bounds (``docs/metrics.md``): float32 paths agree to 1e-7 to 3e-6 on the model matrix
of ``tests/test_model_families.py``, so :data:`BOUNDS` allows 1e-3, several hundred
times that; a 16-bit path rounds every layer's output to 2^-8 (bf16) or 2^-11 (fp16)
relative, and typically differs by 1e-2 (bf16) per token.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

BOUNDS = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}
"""Largest ``rollout/logprob_abs_diff_mean`` expected from float rounding, per dtype."""

JUMP = 4.0
"""After step 1, warn when the value exceeds the bound and this times the largest before."""

METRIC = "rollout/logprob_abs_diff_mean"

_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}


def lowest_precision(dtypes: Iterable[str | None]) -> str:
    """The dtype among ``dtypes`` (names such as ``bfloat16``, ``bf16``, ``auto``) with the
    largest bound; ``float32`` when none is a 16-bit type."""
    names = [_ALIASES.get(str(d), str(d)) for d in dtypes if d]
    return max((n for n in names if n in BOUNDS), key=BOUNDS.__getitem__, default="float32")


class LogProbGuard:
    """Checks each step's ``rollout/logprob_abs_diff_mean`` against its dtype's bound."""

    def __init__(self, dtype: str = "float32", *, filtered_sampling: bool = False) -> None:
        """``filtered_sampling``: the rollout samples under top-k or top-p, whose log-probs
        are of the filtered distribution while the trainer's are not: the two differ by
        design, and the guard stays off."""
        self.dtype = dtype if dtype in BOUNDS else "float32"
        self.bound = BOUNDS[self.dtype]
        self.enabled = not filtered_sampling
        self.largest: float | None = None

    def check(self, step: int, metrics: dict[str, float]) -> str | None:
        """Warn (and return the message) if the step's value is out of bounds: at the
        first step that reports it, or when it jumps (module docstring)."""
        value = metrics.get(METRIC)
        if not self.enabled or value is None or not math.isfinite(value):
            return None
        if metrics.get("async/staleness/max", 0.0) > 0:  # sampled by older weights, by design
            return None
        first, largest = self.largest is None, self.largest or 0.0
        self.largest = max(largest, value)
        if value <= self.bound or not (first or value > JUMP * largest):
            return None
        message = (
            f"{METRIC} = {value:.3g} at step {step}, above {self.bound:g} (the bound for "
            f"{self.dtype}): the trainer's forward and the rollout engine compute different "
            f"distributions. Likely causes: the engine samples in another dtype than the "
            f"trainer computes in; a kernel (ModelConfig.kernel_overrides); an attention "
            f"feature of this model that one side drops (see docs/models.md); or sampling "
            f"settings the engine does not apply to its log-probs (top-k, top-p, "
            f"temperature). `rlkit diagnose` on this experiment compares the two token by "
            f"token and names the cause (docs/diagnose.md); docs/metrics.md says what values "
            f"are normal"
        )
        warnings.warn(message, stacklevel=2)
        return message
