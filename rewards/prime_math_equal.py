"""The second check of PRIME's math reward (Cui et al., "Process Reinforcement through
Implicit Rewards", 2025, arXiv:2502.01456), after PRM800K's grader: ``math_equal`` of
ToRA's evaluation (Gou et al. 2023, arXiv:2309.17452), as verl 0.9.1 runs it.

Both sides are first normalised: ``$12`` -> ``12``, ``45%`` -> ``45``, a base subscript
``1011_2`` -> the integer ``1011`` (a subscript after text that is no number is an error),
and ``\\pi`` -> ``*3.14159...`` (``1*`` when no digit precedes it) with the result
evaluated as arithmetic (:mod:`rewards.literal_arithmetic`). Then the answer is equal when

1. the texts match ignoring case and surrounding space, or ignoring all spaces;
2. both read as numbers (commas dropped) and the answer is within a relative 1e-4 of
   the reference, or of the reference / 100 or * 100 (percentages);
3. with brackets and braces removed the texts match (brackets only when the
   answer's are not the other kind of the reference's);
4. element by element, for tuples and intervals with the same brackets, comma-separated
   lists of the same length, a ``Point(...)`` against a tuple, a ``Matrix(...)`` or a
   nested list against a ``pmatrix``.

The original's last step, SymPy's symbolic comparison, never succeeds in verl 0.9.1: its
time limit is applied in a way that fails before the comparison runs, so every answer
that reaches it is unequal. It is not run here either.

Errors are part of the rule: a subscript on a non-number or an unevaluable ``[...]``
against a ``pmatrix`` raises, and the caller counts the answer as wrong.
"""

from __future__ import annotations

import math
import re
from math import isclose
from typing import Any

from sympy.parsing.sympy_parser import parse_expr

from rewards.literal_arithmetic import evaluate

TOLERANCE = 1e-4
#: At most this many characters of the answer are compared.
MAX_ANSWER_CHARS = 1000
_MONEY = re.compile(r"\$\d+(\.\d+)?")
_PERCENT = (re.compile(r"^\d+(\.\d+)?%$"), re.compile(r"^\d+(\.\d+)?\\%$"))
_INTERVALS = (
    (re.compile(r"^Interval\((.*)\)$"), "[", "]"),
    (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[", ")"),
    (re.compile(r"^Interval\.Lopen\((.*)\)$"), "(", "]"),
    (re.compile(r"^Interval\.open\((.*)\)$"), "(", ")"),
)
_PMATRIX = r"\begin{pmatrix}"


def _with_pi(text: str, pi: float) -> Any:
    """``2\\pi`` -> ``2*pi``, ``\\pi/2`` -> ``1*pi/2``, then evaluated when that is plain
    arithmetic (else the rewritten text)."""
    index = text.find("\\pi")
    while index != -1:
        factor = f"*{pi}" if index > 0 and text[index - 1].isdigit() else f"1*{pi}"
        text = text[:index] + factor + text[index + 3 :]
        index = text.find("\\pi", index + 1)
    try:
        return evaluate(text)
    except Exception:  # noqa: BLE001 - not arithmetic: keep the text
        return text


def normalize(answer: Any, pi: float) -> Any:
    """One side's normal form (module docstring); raises on a subscript after a non-number."""
    if not isinstance(answer, str):
        return answer
    if _MONEY.match(answer):
        return answer[1:]
    if any(p.match(answer) for p in _PERCENT):
        return answer.replace("\\%", "").replace("%", "")
    if "_" in answer:  # a base subscript: 1011_2
        return int(float(answer.split("_")[0]))
    if "\\pi" in answer:
        return _with_pi(answer, pi)
    return answer


def as_number(value: Any) -> float | None:
    """``value``'s text as a float (``{,}`` or else ``,`` thousands marks dropped), or ``None``."""
    text = str(value)
    text = text.replace("{,}", "") if "{,}" in text else text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def _numbers_close(prediction: float, reference: float) -> bool:
    for candidate in (reference / 100, reference, reference * 100):
        try:
            if isclose(candidate, prediction, rel_tol=TOLERANCE):
                return True
        except Exception:  # noqa: BLE001 - as the original: skip what cannot compare
            continue
    return False


def _interval_as_brackets(prediction: str) -> str:
    """SymPy's ``Interval.Ropen(a, b)`` -> ``[a, b)`` and so on."""
    for pattern, left, right in _INTERVALS:
        found = pattern.match(prediction)
        if found:
            return left + found.group(1) + right
    return prediction


def _without_brackets_equal(prediction: str, reference: str) -> bool:
    pred, ref = prediction, reference
    if (pred.startswith("[") and pred.endswith("]") and not ref.startswith("(")) or (
        pred.startswith("(") and pred.endswith(")") and not ref.startswith("[")
    ):
        pred, ref = pred.strip("[]()"), ref.strip("[]()")
    for bracket in "{}()":
        pred, ref = pred.replace(bracket, ""), ref.replace(bracket, "")
    return pred == ref


def _all_equal(predictions: Any, references: Any) -> bool:
    """Every pair equal; every pair is compared (an error in any one propagates)."""
    return all([math_equal(p, r) for p, r in zip(predictions, references)])  # noqa: C419


def _elementwise_equal(prediction: str, reference: str) -> bool | None:
    """Step 4 (module docstring): ``True``/``False`` when decided, else ``None``."""
    if (
        prediction
        and reference
        and prediction[0] in "(["
        and prediction[-1] in ")]"
        and prediction[0] == reference[0]
        and prediction[-1] == reference[-1]
    ):
        preds, refs = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_equal(preds, refs):
            return True
    if "," in prediction and "," in reference:
        preds = [item.strip() for item in prediction.split(",")]
        refs = [item.strip() for item in reference.split(",")]
        if len(preds) == len(refs):
            return _all_equal(preds, refs)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        preds = prediction[prediction.find("(") + 1 : -1].split(",")
        refs = reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_equal(preds, refs):
            return True
    return _matrix_equal(prediction, reference)


def _matrix_equal(prediction: str, reference: str) -> bool | None:
    if _PMATRIX not in reference:
        return None
    if prediction.startswith("Matrix"):
        try:
            matrix = parse_expr(prediction)
            entries = reference.split()[1:-1:2]
            if len(matrix) == len(entries) and _all_equal(matrix, entries):
                return True
        except Exception:  # noqa: BLE001 - as the original: an unreadable matrix is unequal
            pass
    # evaluate() outside the try: its error is the caller's, as in the original.
    elif _is_list_text(prediction) and isinstance(evaluate(prediction), list):
        try:
            rows = _pmatrix_rows(reference)
            matrix = evaluate(prediction)
            if len(matrix) == len(rows) and _all_equal(matrix, rows):
                return True
        except Exception:  # noqa: BLE001
            pass
    return None


def _is_list_text(text: str) -> bool:
    return text.startswith("[") and text.endswith("]")


def _pmatrix_rows(reference: str) -> list[Any]:
    body = (
        reference.removeprefix("\\" + _PMATRIX)
        .removeprefix(_PMATRIX)
        .removesuffix(r"\\end{pmatrix}")
        .removesuffix(r"\end{pmatrix}")
    )
    return [row.split("&") if "&" in row else row for row in body.split("\\")]


def math_equal(prediction: Any, reference: Any, pi: float = math.pi) -> bool:
    """ToRA's ``math_equal`` as verl 0.9.1 runs it (module docstring).

    Args:
        prediction: the extracted answer (text, or a value from a nested comparison).
        reference: the reference answer.
        pi: the value ``\\pi`` stands for (nested comparisons use ``math.pi``).

    Raises:
        Exception: where the original raises (a subscript after a non-number, an
            unevaluable list against a matrix); the caller scores the answer wrong.
    """
    prediction, reference = normalize(prediction, pi), normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > MAX_ANSWER_CHARS:
        prediction = prediction[:MAX_ANSWER_CHARS]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    pred_number, ref_number = as_number(prediction), as_number(reference)
    if pred_number is not None and ref_number is not None:
        return _numbers_close(pred_number, ref_number)
    if not prediction and prediction not in [0, False]:
        return False
    reference, prediction = str(reference).strip(), str(prediction).strip()
    prediction = _interval_as_brackets(prediction)
    if _without_brackets_equal(prediction, reference):
        return True
    # The original's symbolic step (last) never succeeds in verl 0.9.1: module docstring.
    return bool(_elementwise_equal(prediction, reference))
