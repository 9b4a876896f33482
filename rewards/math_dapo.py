"""DAPO's math reward (Yu et al. 2025, arXiv:2503.14476), verl's scorer for ``math_dapo``,
``math``, ``math_dapo_reasoning`` and every ``data_source`` starting with ``aime``.

Only the response's last 300 characters are read. The answer is the text after the
last ``Answer:`` (any case, spaces around the colon allowed) up to the end of its line,
the form DAPO's prompts ask for ("The last line of your response should be of the form
Answer: $Answer"); it and the reference are compared after Minerva's normalisation
(:mod:`rewards.minerva_normalize`). With no ``Answer:`` line, the last ``\\boxed{...}``
in the last 100 characters is the answer, compared *as written* with the reference (no
normalisation). ``strict_box_verify=True`` reads only the boxed answer.

The score is +1.0 when correct and -1.0 otherwise (a missing answer included).
"""

from __future__ import annotations

import re
from typing import Any

from rewards.minerva_normalize import normalize_final_answer
from rlkit.registry import REWARDS

#: Characters of the response that are read (MATH-500's longest answer is 159).
WINDOW_CHARS = 300
#: Characters at the end of that window searched for the ``\boxed{}`` fallback.
BOX_WINDOW_CHARS = 100
#: ``pred`` when no ``Answer:`` line was found.
NO_ANSWER = "[INVALID]"

_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED = "\\boxed{"


def answer_line(text: str) -> str:
    """The normalised answer of the last ``Answer:`` line, or :data:`NO_ANSWER`."""
    found = _ANSWER_LINE.findall(text)
    return normalize_final_answer(found[-1] if found else NO_ANSWER)


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` of ``text`` (braces balanced), or
    ``None`` when there is none or it is not closed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED) : index]
    return None


def _judge(text: str, ground_truth: str, strict_box_verify: bool) -> tuple[bool, str | None]:
    """(correct, pred) for the already-clipped ``text``."""
    boxed = last_boxed(text[-BOX_WINDOW_CHARS:])
    if strict_box_verify:
        return boxed == ground_truth, boxed
    pred = answer_line(text)
    if pred != NO_ANSWER:
        return pred == normalize_final_answer(ground_truth), pred
    if boxed is not None:
        return boxed == ground_truth, boxed
    # No answer at all: pred stays the marker, compared like an answer.
    return pred == normalize_final_answer(ground_truth), pred


@REWARDS.register(
    "math_dapo",
    paper="arXiv:2503.14476",
    summary="DAPO: last 'Answer:' line (Minerva-normalised), else \\boxed{}; +1 / -1",
)
def math_dapo(
    response: str, ground_truth: str, *, strict_box_verify: bool = False, **extra: Any
) -> dict[str, Any]:
    """Score a response with DAPO's rule (module docstring).

    Args:
        response: the model's response text.
        ground_truth: the reference answer.
        strict_box_verify: read only the last ``\\boxed{}`` of the last 100 characters.
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        ``{"score", "acc", "pred"}``: ``score`` is 1.0 or -1.0, ``acc`` a ``bool``,
        ``pred`` the normalised answer (the boxed text as written when it came from
        ``\\boxed{}``; :data:`NO_ANSWER` when there was none; ``None`` under
        ``strict_box_verify`` without a box).
    """
    correct, pred = _judge(response[-WINDOW_CHARS:], ground_truth, strict_box_verify)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
