"""Loop reference of the entropy of a softmax (``algorithms.entropy``)."""

from __future__ import annotations

import math


def entropy(logits_row: list[float]) -> float:
    """Entropy of softmax over one row of logits (may contain −inf; all −inf: 0)."""
    finite = [z for z in logits_row if z != -math.inf]
    if not finite:
        return 0.0
    top = max(finite)
    total = sum(math.exp(z - top) for z in finite)
    return -sum((math.exp(z - top) / total) * ((z - top) - math.log(total)) for z in finite)
