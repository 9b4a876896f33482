"""Exact-match reward: the response, stripped, equals the reference, stripped."""

from __future__ import annotations

from typing import Any

from rlkit.registry import REWARDS


@REWARDS.register(
    "exact_match", summary="1 if the stripped response equals the stripped reference, else 0"
)
def exact_match(
    response: str, ground_truth: str, *, score: float = 1.0, **extra: Any
) -> dict[str, float]:
    """Score ``score`` when ``response.strip() == ground_truth.strip()``, else 0.

    Args:
        response: the decoded model response (special tokens removed).
        ground_truth: the reference string.
        score: the reward for a match.
        **extra: other per-row fields (e.g. ``data_source``); ignored.

    Returns:
        ``{"score": ..., "acc": 1.0 | 0.0}``.
    """
    acc = float(response.strip() == str(ground_truth).strip())
    return {"score": score * acc, "acc": acc}
