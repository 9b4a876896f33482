"""GSM8K correctness reward: the final number of a response against the reference.

Three ways to find the model's answer; the first two as in verl's GSM8K scorer:

- ``strict``: the number after the last ``####`` (the format GSM8K solutions use
  and the instruction "output the final answer after ####" asks for);
- ``flexible``: the last number anywhere in the response.

and a third, ``verl``, that reproduces verl's ``compute_score`` exactly: the last
``#### `` (one space) followed by digits, ``-``, ``.`` and ``,`` in the response's last
300 characters, commas (and dollar signs) removed, compared with the reference *as
text*: ``#### 72.``, ``####72``, ``#### $72``, ``#### 72.0`` and ``#### 072`` all score
0 against ``72``.

With ``strict`` and ``flexible``, numbers are compared as decimals, so ``18``, ``18.0``, ``18.00``, ``$18``,
``-$5``, ``$-5`` and ``1,000`` all parse; ``1,000`` equals ``1000``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from rlkit.registry import REWARDS

# A sign and a dollar sign in either order, then digits with optional thousands
# commas and an optional fraction. The look-behind keeps "x2" and "3.5.7"-style
# fragments from yielding a number that starts mid-token.
_NUMBER = (
    r"(?<![\w.])"
    r"(?:-\s?\$?|\$\s?-?)?"
    r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
)
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + r")")
METHODS = ("strict", "flexible", "verl")

# verl's rule, character for character: only the end of a response is searched.
_VERL_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_VERL_CLIP_CHARS = 300


def verl_answer(text: str) -> str | None:
    """The answer verl's strict GSM8K rule reads from ``text`` (as text), or ``None``."""
    matches = _VERL_RE.findall(text[-_VERL_CLIP_CHARS:])
    return matches[-1].replace(",", "").replace("$", "") if matches else None


def _verl_score(response: str, ground_truth: str, score: float, format_score: float) -> dict:
    # verl's references are the bare answer; a raw GSM8K solution is reduced the same way.
    reference = ground_truth.strip().replace(",", "")
    if "####" in ground_truth:
        reference = verl_answer(ground_truth) or reference
    answer = verl_answer(response)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = answer == reference
    return {
        "score": float(score if correct else format_score),
        "acc": float(correct),
        "pred": answer,
    }


def parse_number(text: str) -> Decimal | None:
    """Parse one number written the GSM8K way.

    Args:
        text: e.g. ``"1,000"``, ``"$18.00"``, ``"-$5"``; surrounding spaces are ignored.

    Returns:
        The value as a :class:`~decimal.Decimal`, or ``None`` if ``text`` is not
        exactly one such number.
    """
    match = _NUMBER_RE.fullmatch(text.strip())
    if match is None:
        return None
    digits = re.sub(r"[\s$,]", "", match.group())
    try:
        return Decimal(digits)
    except InvalidOperation:  # pragma: no cover - the regex only admits valid decimals
        return None


def extract_answer(response: str, method: str = "strict") -> Decimal | None:
    """The model's final answer in ``response`` (see the module docstring for ``method``).

    Returns:
        The parsed number, or ``None`` when the response holds no answer of that form.
    """
    if method == "strict":
        matches = _STRICT_RE.findall(response)
    elif method == "flexible":
        matches = _NUMBER_RE.findall(response)
    else:
        raise ValueError(f"unknown gsm8k method {method!r}; choose one of {METHODS}")
    return parse_number(matches[-1]) if matches else None


@REWARDS.register("gsm8k", summary="GSM8K final number (#### N or last number) vs reference")
def gsm8k(
    response: str,
    ground_truth: str,
    *,
    method: str = "strict",
    score: float = 1.0,
    format_score: float = 0.0,
    **extra: Any,
) -> dict[str, Any]:
    """Score a GSM8K response by its final number.

    Args:
        response: the model's response text.
        ground_truth: the reference number as a string (``"18"``, ``"1,000"`` and
            ``"$18"`` are accepted too), or a raw GSM8K solution ending in ``#### 18``.
        method: ``"strict"`` reads the number after the last ``####``;
            ``"flexible"`` reads the last number in the text; ``"verl"`` applies
            verl's rule and text comparison exactly (see the module docstring).
        score: reward for a correct answer (verl: 1.0).
        format_score: reward for an answer that was found but is wrong (verl: 0.0).
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        ``{"score", "acc", "pred"}``: ``score`` is ``score`` if the extracted
        number equals the reference, ``format_score`` if a number was found but
        differs, ``0.0`` if none was found; ``acc`` is 1.0 or 0.0 (correctness
        whatever the score options); ``pred`` is the extracted number (``""`` if none).

    Raises:
        ValueError: ``ground_truth`` is not a number (a data bug, not a model error),
            or ``method`` is unknown.
    """
    if method == "verl":
        return _verl_score(response, ground_truth, score, format_score)
    reference = parse_number(ground_truth)
    if reference is None and "####" in ground_truth:
        # A raw GSM8K solution ("...\n#### 18", as the hub's answer column holds it):
        # its reference is the number after the last "####".
        reference = extract_answer(ground_truth, "strict")
    if reference is None:
        raise ValueError(
            f"gsm8k ground truth must be a number like '18' or '1,000', got {ground_truth!r}; "
            f"check the dataset's answer column"
        )
    answer = extract_answer(response, method)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = answer == reference
    return {
        "score": float(score if correct else format_score),
        "acc": float(correct),
        "pred": str(answer),
    }
