"""``zero``: no outcome reward, for rollouts whose environment gives all of it."""

from __future__ import annotations

from typing import Any

from rlkit.registry import REWARDS


@REWARDS.register(
    "zero", summary="no outcome reward: token rewards from the environment are the whole reward"
)
def zero(response: str, ground_truth: str, **extra: Any) -> float:
    """0 for every response: the rollout's token rewards (e.g. an interaction's scores,
    ``Trajectory.token_rewards``) are the whole reward.

    Args:
        response: ignored.
        ground_truth: ignored.
        **extra: ignored.

    Returns:
        ``0.0``.
    """
    return 0.0
