"""Evaluate Python text that is only literals and arithmetic, as ``eval`` would, without
running anything else.

PRIME's grader hands answer text to Python's ``eval`` (``2\\pi`` becomes
``2*3.141592653589793`` and is evaluated; a ``[1, 2]`` answer against a matrix is read as
a list). Model output must not run as code, so :func:`evaluate` accepts only number,
string and other constant literals, tuples, lists and sets of them, unary ``+``/``-`` and
the arithmetic operators ``+ - * / // % **``, and gives what ``eval`` gives for those.
Anything else (names, calls, attributes, comparisons), an exponent that would build an
integer of more than :data:`MAX_POWER_BITS` bits, and sequence repetition raise
:class:`NotArithmetic`, where ``eval`` would have run the code.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

#: Largest ``int ** int`` result (in bits) that is computed; larger ones raise.
MAX_POWER_BITS = 100_000

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_NUMBER = (int, float, complex)


class NotArithmetic(ValueError):
    """The text is not only literals and arithmetic (or is too costly to evaluate)."""


def _check_operands(op: ast.operator, left: Any, right: Any) -> None:
    if isinstance(op, ast.Mult) and not (isinstance(left, _NUMBER) and isinstance(right, _NUMBER)):
        raise NotArithmetic("sequence repetition is not evaluated")
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
        bits = max(abs(left), 2).bit_length() * abs(right)
        if abs(left) > 1 and right > 0 and bits > MAX_POWER_BITS:
            raise NotArithmetic(f"a power of about {bits} bits is not evaluated")
    if isinstance(op, ast.Mod) and isinstance(left, str):
        raise NotArithmetic("string formatting is not evaluated")


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_value(e) for e in node.elts}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        _check_operands(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    raise NotArithmetic(f"{type(node).__name__} is not evaluated")


def evaluate(text: str) -> Any:
    """``eval(text)`` for literal arithmetic (module docstring).

    Raises:
        NotArithmetic: ``text`` holds anything else.
        SyntaxError, ArithmeticError, TypeError, ...: whatever ``eval`` raises on it.
    """
    # eval() ignores leading spaces and tabs of its source; ast.parse does not.
    tree = ast.parse(text.lstrip(" \t"), mode="eval")
    return _value(tree.body)
