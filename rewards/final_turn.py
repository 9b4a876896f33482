"""Rewards on the policy's last turn, for multi-turn rollouts with tools: exact match
(``final_turn_match``) or any correctness reward on the final answer (``final_turn``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewards.batched_reward import per_response_reward
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


TOOL_CALL_TAG = "<tool_call>"


def _check_final_turn_options(options: Mapping[str, Any]) -> None:
    """``DataConfig.reward_options`` of ``final_turn``: ``base`` names a per-response reward."""
    if "base" not in options:
        raise ValueError("the 'final_turn' reward needs the option 'base' (e.g. 'gsm8k')")
    per_response_reward(options["base"], used_by="final_turn")


@REWARDS.register(
    "final_turn",
    summary="a correctness reward (base) on the policy's final answer (multi-turn aware)",
    check_options=_check_final_turn_options,
)
def final_turn(
    response: str,
    ground_truth: str,
    *,
    base: str,
    base_options: Mapping[str, Any] | None = None,
    conversation: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Score the conversation's final answer with the reward ``base`` (e.g. ``gsm8k``).

    A multi-turn response holds tool calls and tool results (numbers a ``gsm8k``
    ``flexible`` reading would take for the answer); only the policy's final answer
    counts: the content of the conversation's last message when it is an ``assistant``
    message that calls no tool. A conversation that ends in a tool message (the budget
    ran out while the policy was still working) or in a turn that still calls a tool
    (the turn limit) has no answer and scores 0. A single-turn rollout (no
    ``conversation``) scores its whole response.

    Args:
        response: the decoded response (every token after the prompt).
        ground_truth: the reference answer.
        base: the correctness reward's name (``"gsm8k"``, ``"math"``, ``pkg.module:fn``).
        base_options: static options of ``base`` (e.g. ``{"method": "flexible"}``).
        conversation: the whole chat of a multi-turn rollout (reward context), or ``None``.
        **extra: per-sample fields (``data_source``, ``response_length``), passed to ``base``.

    Returns:
        The base's fields (``score``, ``acc``, ...; for no answer, those of an empty
        answer with ``score`` and ``acc`` 0) and ``answered`` (1.0 | 0.0).
    """
    answer: str | None = response
    if conversation:
        last = conversation[-1]
        content = str(last.get("content") or "")
        is_answer = last.get("role") == "assistant" and TOOL_CALL_TAG not in content
        answer = content if is_answer else None
    fn = per_response_reward(base, used_by="final_turn")
    value = fn("" if answer is None else answer, ground_truth, **{**extra, **(base_options or {})})
    out = dict(value) if isinstance(value, Mapping) else {"score": value}
    if "score" not in out:
        raise ValueError(f"reward {base!r} returned a dict without a 'score' key")
    if answer is None:
        out["score"] = 0.0
        if "acc" in out:
            out["acc"] = 0.0
    out["answered"] = float(answer is not None)
    return out
