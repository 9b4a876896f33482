"""MATH / AIME correctness reward: answer equivalence through math-verify.

The response's final answer (``\\boxed{...}`` first, then "the final answer is
..."; with ``method="flexible"`` any last expression) is parsed to SymPy and
compared with the reference by math-verify (``parse`` + ``verify``), the
verifier most RL-for-math work uses. It handles LaTeX fractions
(``\\dfrac12`` = ``0.5``), radicals (``2\\sqrt3`` = ``\\sqrt{12}``), intervals,
tuples, sets, ``x = 3`` against ``3``, units and ``\\text{(C)}`` against ``C``,
and integers with leading zeros (``025`` = ``25``, as AIME answers are written).

Time limits: math-verify's own limits use ``signal.alarm``, which raises outside
the main thread, so they are turned off here; :func:`rewards.score_batch` puts
every call under our own limit instead. Answers whose value is astronomically
large (``9^{9^{9^9}}``, ``(10^8)!``) are rejected before comparison, because
SymPy would evaluate them inside one C call that no in-process limit can stop.
"""

from __future__ import annotations

import functools
import logging
import math as pymath
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlkit.registry import REWARDS

METHODS = ("strict", "flexible")
#: Answers whose integer parts may exceed this many bits are not compared.
MAX_ANSWER_BITS = 100_000

_GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_CONFIGS = {
    "strict": (LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),),
    "flexible": (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()),
}


class _DropDisabledTimeoutWarning(logging.Filter):
    # math-verify warns once per process that its timeout is off; ours is on.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str) -> tuple[Any, ...]:
    # A group of n responses shares one reference: parse it once.
    parsed = parse(
        "\\boxed{" + ground_truth + "}", extraction_config=_GOLD_CONFIG, parsing_timeout=None
    )
    if not parsed:
        parsed = parse(f"${ground_truth}$", extraction_config=_GOLD_CONFIG, parsing_timeout=None)
    # The raw string keeps string comparison possible when nothing parses.
    return tuple(parsed) if parsed else (ground_truth,)


def _log2_bound(expr: Any) -> float:
    """Upper bound on log2 of the magnitude of the numbers SymPy would compute."""
    if isinstance(expr, sympy.MatrixBase):
        return max((_log2_bound(e) for e in expr), default=0.0)
    if not isinstance(expr, sympy.Basic):
        return 0.0
    if isinstance(expr, sympy.Integer):
        return float(abs(int(expr)).bit_length())
    if isinstance(expr, sympy.Rational):
        return float(max(abs(expr.p).bit_length(), expr.q.bit_length()))
    if isinstance(expr, sympy.Pow):
        base, exponent = _log2_bound(expr.base), _log2_bound(expr.exp)
        # |b^e| <= 2^(log2|b| * |e|) and |e| <= 2^exponent.
        return pymath.inf if exponent > 64 else max(base, 1.0) * 2.0**exponent
    if isinstance(expr, sympy.factorial):
        n_bits = _log2_bound(expr.args[0])
        return pymath.inf if n_bits > 64 else 2.0**n_bits * max(n_bits, 1.0)
    parts = [_log2_bound(a) for a in expr.args]
    if isinstance(expr, sympy.Mul):
        return sum(parts)
    return max(parts, default=0.0) + pymath.log2(max(len(parts), 1))


def extract_answer(response: str, method: str = "strict") -> list[Any]:
    """Parse the final answer of ``response`` with math-verify.

    Args:
        response: the model's response text.
        method: ``"strict"`` accepts ``\\boxed{}`` and "final answer is ..."
            anchors only; ``"flexible"`` also takes the last LaTeX or plain
            expression anywhere.

    Returns:
        math-verify's parse: ``[sympy_object, answer_string]``, or ``[]`` when no
        answer was found or the answer is too large to compare safely.
    """
    if method not in _PRED_CONFIGS:
        raise ValueError(f"unknown math method {method!r}; choose one of {METHODS}")
    parsed = parse(response, extraction_config=_PRED_CONFIGS[method], parsing_timeout=None)
    if any(_log2_bound(p) > MAX_ANSWER_BITS for p in parsed):
        return []
    return parsed


@REWARDS.register("math", summary="math-verify equivalence of the boxed answer (MATH, AIME)")
def math_answer(
    response: str,
    ground_truth: str,
    *,
    method: str = "strict",
    score: float = 1.0,
    format_score: float = 0.0,
    **extra: Any,
) -> dict[str, Any]:
    """Score a math response by symbolic equivalence of its final answer.

    Args:
        response: the model's response text.
        ground_truth: the reference answer in LaTeX or plain text
            (``"\\frac{3}{5}"``, ``"(3, \\frac{\\pi}{2})"``, ``"25"``).
        method: answer extraction, ``"strict"`` (boxed / final answer) or
            ``"flexible"`` (also the last expression anywhere).
        score: reward for an equivalent answer.
        format_score: reward for an answer that was found but is not equivalent.
        **extra: per-sample fields of the reward contract; unused here.

    Returns:
        ``{"score", "acc", "pred"}``: ``score`` is ``score`` for an equivalent
        answer, ``format_score`` for a different one, ``0.0`` when none was
        found; ``acc`` is 1.0 or 0.0; ``pred`` is the extracted answer as written
        (``""`` if none).
    """
    answer = extract_answer(response, method)
    if not answer:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = verify(list(_parse_gold(ground_truth)), answer, timeout_seconds=None)
    return {
        "score": float(score if correct else format_score),
        "acc": float(correct),
        "pred": str(answer[-1]),
    }
