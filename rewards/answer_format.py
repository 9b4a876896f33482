"""Format reward: reasoning in ``<think>...</think>``, then a final answer.

The shape reasoning-RL recipes (DeepSeek-R1, arXiv:2501.12948) reward on top
of correctness: exactly one closed thinking block, followed by the answer in an
answer tag (``<answer>...</answer>``, ending the response) or in ``\\boxed{}``.
"""

from __future__ import annotations

import re
from typing import Any

from rlkit.registry import REWARDS

ANSWER_STYLES = ("tag", "boxed", "either")


def has_think_answer_format(
    response: str,
    *,
    think_tag: str = "think",
    answer_tag: str = "answer",
    answer_style: str = "either",
    require_open_tag: bool = True,
) -> bool:
    """Whether ``response`` is one thinking block followed by an answer.

    Args:
        response: the model's response text.
        think_tag: name of the thinking tag (``<think>``).
        answer_tag: name of the answer tag (``<answer>``).
        answer_style: ``"tag"`` (the text after ``</think>`` is one non-empty
            ``<answer>...</answer>``), ``"boxed"`` (it contains ``\\boxed{``) or
            ``"either"``.
        require_open_tag: ``False`` when the chat template already opens
            ``<think>`` in the prompt, so the response starts inside the block.

    Returns:
        ``True`` if the format holds.
    """
    if answer_style not in ANSWER_STYLES:
        raise ValueError(f"unknown answer_style {answer_style!r}; choose one of {ANSWER_STYLES}")
    open_tag, close_tag = f"<{think_tag}>", f"</{think_tag}>"
    if response.count(close_tag) != 1 or response.count(open_tag) > 1:
        return False
    thinking, after = response.split(close_tag)
    if require_open_tag and not thinking.lstrip().startswith(open_tag):
        return False
    if not thinking.replace(open_tag, "").strip():
        return False
    tagged = re.fullmatch(rf"\s*<{answer_tag}>(.*?)</{answer_tag}>\s*", after, flags=re.DOTALL)
    tag_ok = tagged is not None and bool(tagged.group(1).strip())
    boxed_ok = "\\boxed{" in after
    return {"tag": tag_ok, "boxed": boxed_ok, "either": tag_ok or boxed_ok}[answer_style]


@REWARDS.register(
    "format", paper="arXiv:2501.12948", summary="<think>...</think> then an answer tag or boxed"
)
def think_answer_format(
    response: str,
    ground_truth: str = "",
    *,
    score: float = 1.0,
    think_tag: str = "think",
    answer_tag: str = "answer",
    answer_style: str = "either",
    require_open_tag: bool = True,
    **extra: Any,
) -> float:
    """Reward the thinking-then-answer format (see :func:`has_think_answer_format`).

    Args:
        response: the model's response text.
        ground_truth: unused (the format does not depend on the answer).
        score: reward when the format holds.
        think_tag: see :func:`has_think_answer_format`.
        answer_tag: see :func:`has_think_answer_format`.
        answer_style: see :func:`has_think_answer_format`.
        require_open_tag: see :func:`has_think_answer_format`.
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        ``score`` if the format holds, else ``0.0``.
    """
    ok = has_think_answer_format(
        response,
        think_tag=think_tag,
        answer_tag=answer_tag,
        answer_style=answer_style,
        require_open_tag=require_open_tag,
    )
    return float(score) if ok else 0.0
