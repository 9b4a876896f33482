"""MATH correctness as the benchmark's own checker scores it (Hendrycks et al. 2021,
arXiv:2103.03874), verl's scorer for ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``
and ``HuggingFaceH4/MATH-500``.

The answer is the response's last ``\\boxed{...}`` (braces balanced), or, when the
response holds ``\\boxed `` with a space, the text after the last ``\\boxed `` up to the
next ``$``. It scores 1.0 when it has the same normal form as the reference
(:mod:`rewards.hendrycks_normalize`), else 0.0. Nothing else counts as an answer: a last
``\\boxed`` not followed by ``{`` (``\\boxed\\n{3}``), an unclosed ``\\boxed{``, and
``\\fbox{...}`` (searched for only when there is no ``\\boxed``) all score 0.
"""

from __future__ import annotations

from typing import Any

from rewards.hendrycks_normalize import equivalent
from rlkit.registry import REWARDS

_SPACED = "\\boxed "
_BOXED = "\\boxed{"


def _balanced_end(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the first ``{`` at or after ``start``, or ``None``."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def boxed_answer(response: str) -> str | None:
    """The benchmark's final answer of ``response`` (module docstring), or ``None``."""
    if _SPACED in response:
        return response.split(_SPACED)[-1].split("$")[0]
    start = response.rfind("\\boxed")
    if start < 0:
        start = response.rfind("\\fbox")
        if start < 0:
            return None
    end = _balanced_end(response, start)
    if end is None or not response.startswith(_BOXED, start):
        return None  # \fbox{..}, \boxed\n{..}, or no closing brace: no answer
    return response[start + len(_BOXED) : end]


@REWARDS.register(
    "hendrycks_math",
    paper="arXiv:2103.03874",
    summary="MATH's own checker: last \\boxed{} vs the reference after normalisation (1/0)",
)
def hendrycks_math(response: str, ground_truth: str, **extra: Any) -> float:
    """Score a MATH response as the benchmark does (module docstring).

    Args:
        response: the model's response text.
        ground_truth: the reference answer in the benchmark's LaTeX (``"\\frac{3}{5}"``).
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        1.0 when the boxed answer is equivalent to the reference, else 0.0.
    """
    answer = boxed_answer(response)
    return 1.0 if answer is not None and equivalent(answer, ground_truth) else 0.0
