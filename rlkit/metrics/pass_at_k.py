"""The unbiased pass@k estimator of Chen et al. 2021 (arXiv:2107.03374)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c correct.

    ``1 - C(n-c, k) / C(n, k)``, computed as a stable product. Requires ``1 <= k <= n``.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"number correct c={c} must be within [0, n={n}]")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_and_pass_at_k(
    correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None
) -> dict[str, float]:
    """Average mean@n and pass@k over problems, each with the same number n of samples.

    Args:
        correct: per problem, one boolean per sample.
        ks: the k values (default: 1, 2, 4, ... up to n, and n).

    Returns:
        ``{"mean@n": ..., "pass@k": ...}`` averaged over problems.
    """
    if not correct:
        raise ValueError("no problems to evaluate")
    n = len(correct[0])
    if n == 0 or any(len(c) != n for c in correct):
        raise ValueError("every problem needs the same, non-zero number of samples")
    ks = sorted(set(ks or [*(2**i for i in range(n.bit_length()) if 2**i <= n), n]))
    out = {f"mean@{n}": float(np.mean([np.mean(c) for c in correct]))}
    for k in ks:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, int(sum(c)), k) for c in correct]))
    return out
