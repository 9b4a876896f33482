"""PRIME's math reward (Cui et al., "Process Reinforcement through Implicit Rewards",
2025, arXiv:2502.01456), verl's scorer for the NuminaMath sources ``numina_aops_forum``,
``numina_synthetic_math``, ``numina_amc_aime``, ``numina_synthetic_amc``,
``numina_cn_k12`` and ``numina_olympiads``.

**The answer** is cut out of the response in steps, each working on what the previous
left (markers found case-insensitively, the last occurrence):

1. after ``answer:``, then after ``answer is``, then after ``answers are``;
2. before ``is answer``, ``is the answer``, ``are answers``, ``are the answers``;
3. the contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), when not empty;
4. before the last ``". "``;
5. after ``be ``, ``is ``, ``are ``, ``=``, ``: ``, ``get `` (and those words followed by a
   line break), in that order.

**Correct** when PRM800K's grader accepts it (:mod:`rewards.prm800k_grader`), or else
ToRA's ``math_equal`` does (:mod:`rewards.prime_math_equal`; with ``\\pi`` in either the
answer or the reference, with ``\\pi`` read as ``math.pi`` and as ``3.14``, both tried).
An error in the second check scores the answer wrong. The score is 1.0 or 0.0.
"""

from __future__ import annotations

import math
from typing import Any

from rewards.prime_math_equal import math_equal
from rewards.prm800k_grader import grade_answer
from rlkit.registry import REWARDS

_AFTER = ("answer:", "answer is", "answers are")
_BEFORE = ("is answer", "is the answer", "are answers", "are the answers")
_LAST_AFTER = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")
#: The values ``\pi`` is read as by the second check.
PI_VALUES = (math.pi, 3.14)


def last_box_contents(text: str) -> str | None:
    """The stripped contents of the last ``\\boxed`` (else ``\\fbox``): from the first
    ``{`` after it to its balancing ``}``; ``None`` when there is no such pair."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    opening, depth = None, 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
            opening = index if opening is None else opening
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return None if opening is None else text[opening + 1 : index].strip()
    return None


def _after_last(text: str, marker: str) -> str:
    # The index comes from the lower-cased text, as in the original.
    index = text.lower().rfind(marker)
    return text if index == -1 else text[index + len(marker) :].strip()


def _before_last(text: str, marker: str) -> str:
    index = text.lower().rfind(marker)
    return text if index == -1 else text[:index].strip()


def extract_answer(response: str) -> str:
    """PRIME's answer text of ``response`` (module docstring)."""
    for marker in _AFTER:
        response = _after_last(response, marker)
    for marker in _BEFORE:
        response = _before_last(response, marker)
    boxed = last_box_contents(response)
    if boxed:
        response = boxed
    if ". " in response:
        response = _before_last(response, ". ")
    for marker in _LAST_AFTER:
        response = _after_last(response, marker)
    return response


def is_correct(answer: str, ground_truth: str) -> bool:
    """PRIME's verdict on an extracted answer (module docstring)."""
    if grade_answer(answer, ground_truth):
        return True
    try:
        if "\\pi" in answer or "\\pi" in ground_truth:
            # Both values are tried even when the first succeeds: an error in either
            # makes the answer wrong.
            return any([math_equal(answer, ground_truth, pi=pi) for pi in PI_VALUES])  # noqa: C419
        return math_equal(answer, ground_truth)
    except Exception:  # noqa: BLE001 - part of the rule: an error scores the answer wrong
        return False


@REWARDS.register(
    "prime_math",
    paper="arXiv:2502.01456",
    summary="PRIME: answer cut from the text, PRM800K grader then ToRA math_equal (1/0)",
)
def prime_math(response: str, ground_truth: str, **extra: Any) -> float:
    """Score a response with PRIME's rule (module docstring).

    Args:
        response: the model's response text.
        ground_truth: the reference answer.
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        1.0 when the extracted answer is correct, else 0.0.
    """
    return 1.0 if is_correct(extract_answer(str(response)), str(ground_truth)) else 0.0
