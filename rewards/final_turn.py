"""Exact match on the policy's last turn, for multi-turn rollouts with tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.registry import REWARDS


@REWARDS.register(
    "final_turn_match",
    summary="1 if the policy's last turn, stripped, equals the reference (multi-turn aware)",
)
def final_turn_match(
    response: str,
    ground_truth: str,
    *,
    conversation: Sequence[Mapping[str, Any]] | None = None,
    score: float = 1.0,
    **extra: Any,
) -> dict[str, float]:
    """Score ``score`` when the final answer equals the reference, else 0.

    The final answer is the content of the conversation's last ``assistant`` message
    when the rollout had several turns (tool calls and results before it are the
    working, not the answer), else the whole response. A conversation that ends in a
    tool message (the budget ran out while the policy was still working) scores 0.

    Args:
        response: the decoded response (every token after the prompt).
        ground_truth: the reference string.
        conversation: the whole chat of a multi-turn rollout (reward context), or ``None``.
        score: the reward for a match.
        **extra: other per-row fields; ignored.

    Returns:
        ``{"score": ..., "acc": 1.0 | 0.0, "turns": number of assistant turns}``.
    """
    turns = [m for m in conversation or () if m.get("role") == "assistant"]
    if conversation and conversation[-1].get("role") != "assistant":
        answer = None
    else:
        answer = turns[-1]["content"] if turns else response
    acc = float(answer is not None and answer.strip() == str(ground_truth).strip())
    return {"score": score * acc, "acc": acc, "turns": float(max(len(turns), 1))}
