"""PRM800K's answer grader (Lightman et al., "Let's Verify Step by Step", 2023,
arXiv:2305.20050; ``prm800k/grading/grader.py``), the first check of PRIME's math
reward (:mod:`rewards.prime_math`).

An answer is correct when (a) it has the same MATH normal form as the reference
(:mod:`rewards.hendrycks_normalize`, after stripping and unwrapping one ``\\text{}``), or
(b) both have the same *PRM800K* normal form (:func:`normalize`), or (c) element by
element (tuples and intervals split at commas, brackets matching) each pair is equal:
reduced fractions ``a/b`` must match as written, an integer only matches an integer
written the same way, and anything else matches when SymPy simplifies the difference
to 0. SymPy is only tried on expressions with at most two distinct letters and no
``^{``, ``^(``, stacked or multi-digit exponents (those can run for ever).

Time: verl runs each SymPy comparison in a forked process with a 10 s limit; here it
runs in the calling process, and :func:`rewards.score_batch` limits the whole reward
call (its time-out scores 0 and is counted), as for the ``math`` reward.
"""

from __future__ import annotations

import re

import sympy
from pylatexenc import latex2text
from sympy.parsing import sympy_parser

from rewards.hendrycks_normalize import NotNormalizable
from rewards.hendrycks_normalize import normalize as hendrycks_normalize

#: Unit words deleted (with a plural ``s``/``es`` and a ``^N`` power) by :func:`normalize`.
UNITS: tuple[str, ...] = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
    "liter",
)
#: Expressions containing these are never handed to SymPy.
_RISKY_SUBSTRINGS = ("^{", "^(")
_RISKY_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"
_ENCLOSING_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_UNIT_PATTERNS = tuple(re.compile(f"{unit}(es)?(s)? *(\\^[0-9]+)?") for unit in UNITS)
_LARGE_NUMBER_WORDS = (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_SYMBOL_NAMES = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
_THOUSANDS_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_TRANSFORMS = sympy_parser.standard_transformations + (
    sympy_parser.implicit_multiplication_application,
)


def mathd_normalize(answer: str) -> str:
    """The MATH normal form of a stripped answer with one enclosing ``\\text{}`` removed
    (the unnormalised text when the MATH normalisation fails on it)."""
    answer = answer.strip()
    enclosed = _ENCLOSING_TEXT.search(answer)
    if enclosed is not None:
        answer = enclosed.group("text").strip()
    try:
        return hendrycks_normalize(answer)
    except NotNormalizable:
        return answer


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _near_integer(value: float) -> bool:
    try:
        return abs(value - int(round(value))) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def strip_thousands_commas(text: str) -> str:
    """``1,000,000`` -> ``1000000``, leaving commas between tuple elements."""
    while True:
        stripped = _THOUSANDS_COMMA.sub(r"\1\3\4", text)
        if stripped == text:
            return text
        text = stripped


def is_integer_text(text: str) -> bool:
    """Whether ``text`` (thousands commas allowed) is a number within 1e-7 of an integer."""
    value = _as_float(strip_thousands_commas(text))
    return value is not None and _near_integer(value)


def _latex_to_text(expr: str) -> str:
    """LaTeX -> plain text SymPy can read (``\\frac{1}{2}`` -> ``1/2``, ``√`` -> ``sqrt``)."""
    for spelling in ("\\tfrac", "\\dfrac"):
        expr = expr.replace(spelling, "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # "1\frac{1}{2}" is a mixed number
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in _SYMBOL_NAMES:
        expr = expr.replace(symbol, name)
    return expr.strip()


def _latex_to_text_or_same(expr: str) -> str:
    try:
        return _latex_to_text(expr)
    except Exception:  # noqa: BLE001 - an unreadable LaTeX answer stays as written
        return expr


def normalize(expr: str) -> str:
    """PRM800K's normal form: units, ``$``, ``%`` and ``\\text{}`` dropped, LaTeX made
    plain text, integers written canonically, lower case."""
    enclosed = _ENCLOSING_TEXT.search(expr)
    if enclosed is not None:
        expr = enclosed.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", "")):
        expr = expr.replace(old, new)
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in _LARGE_NUMBER_WORDS:
        expr = expr.replace(word, power)
    for unit in _UNIT_PATTERNS:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _as_float(expr)
    if value is not None and _near_integer(value):
        expr = str(int(round(value)))
    if "\\" in expr:
        expr = _latex_to_text_or_same(expr)
    expr = re.sub("- *", "-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)  # "7 3/4" -> "7+3/4"
    expr = expr.lower()
    if is_integer_text(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _sympy_may_try(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or any(s in expr for s in _RISKY_SUBSTRINGS):
        return False
    return all(pattern.search(expr) is None for pattern in _RISKY_PATTERNS)


def sympy_equal(reference: str, answer: str) -> bool:
    """Whether SymPy simplifies ``(reference) - (answer)`` to 0 (``False`` when it may
    not try, or cannot parse either)."""
    expr = f"({reference})-({answer})"
    if not _sympy_may_try(expr):
        return False
    try:
        difference = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=_TRANSFORMS)
        return bool(sympy.simplify(difference) == 0)
    except Exception:  # noqa: BLE001 - SymPy raises many kinds on odd input
        return False


def split_elements(expr: str) -> list[str]:
    """The elements of a tuple or interval ``(a, b]`` (brackets at both ends and none
    inside), else ``[expr]``; ``[]`` for an empty string."""
    expr = strip_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _BRACKETS
        and expr[-1] in _BRACKETS
        and not any(b in inner for b in _BRACKETS)
    ):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def _elements_equal(reference: str, answer: str) -> bool:
    if _FRACTION.search(reference) and _FRACTION.search(answer):
        return reference == answer  # unreduced fractions must not pass through SymPy
    if is_integer_text(reference) != is_integer_text(answer):
        return False
    return sympy_equal(reference, answer)


def grade_answer(answer: str, reference: str) -> bool:
    """PRM800K's verdict on ``answer`` against ``reference`` (module docstring)."""
    if mathd_normalize(reference) == mathd_normalize(answer):
        return True
    reference, answer = normalize(reference), normalize(answer)
    if reference == answer:
        return True
    if not answer:
        return False
    reference_parts, answer_parts = split_elements(reference), split_elements(answer)
    if len(reference_parts) != len(answer_parts):
        return False
    if len(reference_parts) > 1 and (reference[0], reference[-1]) != (answer[0], answer[-1]):
        return False  # a tuple against an interval, or ( against [
    return all(_elements_equal(r, a) for r, a in zip(reference_parts, answer_parts))
