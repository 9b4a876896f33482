"""Geometry3K's reward (verl's scorer for ``hiyouga/geometry3k``, from EasyR1): correctness
of the boxed answer plus a format bonus.

``score = 0.9 * accuracy + 0.1 * format``, where

- accuracy is 1.0 when mathruler's ``grade_answer`` (PRM800K's grader as packaged by
  `mathruler <https://pypi.org/project/mathruler/>`_) accepts the contents of the last
  ``\\boxed{...}`` against the reference (a response without a closed box is graded as
  the answer ``"None"``);
- format is 1.0 when the whole response is ``<think>...</think>`` followed, anywhere
  later, by ``\\boxed{...}`` (the R1 format, arXiv:2501.12948).

So an unformatted correct answer scores 0.9, a formatted wrong one 0.1.
"""

from __future__ import annotations

import re
from typing import Any

from rlkit.registry import REWARDS

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_score(response: str) -> float:
    """1.0 for ``<think>...</think> ... \\boxed{...}``, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(response) else 0.0


def accuracy(response: str, ground_truth: str) -> float:
    """1.0 when mathruler grades the last boxed answer equal to ``ground_truth``."""
    from mathruler.grader import extract_boxed_content, grade_answer

    try:
        return 1.0 if grade_answer(extract_boxed_content(response), ground_truth) else 0.0
    except Exception:  # noqa: BLE001 - a grader error on odd output scores it wrong
        return 0.0


@REWARDS.register(
    "geo3k",
    summary="Geometry3K: 0.9 * mathruler grade of the last \\boxed{} + 0.1 * <think> format",
)
def geo3k(response: str, ground_truth: str, *, format_weight: float = 0.1, **extra: Any) -> float:
    """Score a Geometry3K response (module docstring).

    Args:
        response: the model's response text.
        ground_truth: the reference answer.
        format_weight: the weight of the format term (verl's ``format_score``, 0.1); the
            accuracy term gets ``1 - format_weight``.
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        The weighted score, in [0, 1].
    """
    return (1.0 - format_weight) * accuracy(response, ground_truth) + format_weight * format_score(
        response
    )
