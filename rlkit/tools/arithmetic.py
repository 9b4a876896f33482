"""The ``calculator`` tool: exact arithmetic on a parsed expression, never ``eval``.

The expression is parsed with :func:`ast.parse` and walked node by node; only
numbers, ``+ - * / // % **``, unary ``+``/``-``, parentheses, the constants ``pi``,
``e`` and ``tau``, and the functions in :data:`FUNCTIONS` are evaluated. Everything
else (names, attribute access, subscripts, comparisons, strings, lambdas, calls of
anything else) is refused with a message.

Integers and fractions stay exact: ``123456789 * 987654321`` is
``121932631112635269``, ``10 / 4`` is ``2.5`` and ``6 / 3`` is ``2``; a float
operand or a transcendental function gives a float. Limits keep every call
cheap: the expression is at most :data:`MAX_EXPRESSION_CHARS` long, and every
intermediate and final result must be at most :data:`MAX_MAGNITUDE` (10**100) in
absolute value (a power is checked before it is computed, so ``9 ** 9 ** 9`` is
refused at once).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from rlkit.registry import TOOLS
from rlkit.tools.base import ToolError

#: Longest expression accepted, in characters.
MAX_EXPRESSION_CHARS = 1000
#: Largest absolute value of any intermediate or final result.
MAX_MAGNITUDE = 10**100
_MAX_DIGITS = 100  # log10(MAX_MAGNITUDE)

Number = int | Fraction | float

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _fail(message: str) -> ToolError:
    return ToolError(f"Error: {message}")


def _checked(value: Any) -> Number:
    """Normalise a result (integral fractions to int) and enforce the limits."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, Fraction):
        if value.denominator == 1:
            value = value.numerator
        elif abs(value) > MAX_MAGNITUDE:
            raise _fail("result too large (limit 1e100)")
        elif value.denominator > MAX_MAGNITUDE:
            value = float(value)  # exact digits past the limit: give a float instead
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise _fail("result too large (limit 1e100)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _fail("result is not a finite number")
        if abs(value) > MAX_MAGNITUDE:
            raise _fail("result too large (limit 1e100)")
        return value
    if isinstance(value, Fraction):
        return value
    if isinstance(value, complex):
        raise _fail("result is not a real number")
    raise _fail(f"unsupported value of type {type(value).__name__}")


def _log10_size(x: int | Fraction) -> float:
    """log10 of the larger of |numerator|, denominator: the digits of an exact value."""
    x = Fraction(x)
    num, den = abs(x.numerator), x.denominator
    return max(math.log10(num) if num else 0.0, math.log10(den))


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        exponent = exponent.numerator
    if isinstance(base, int | Fraction) and isinstance(exponent, int):
        if base == 0 and exponent < 0:
            raise _fail("division by zero")
        if abs(base) in (0, 1):
            return _checked(Fraction(base) ** exponent)
        if _log10_size(base) * abs(exponent) <= _MAX_DIGITS + 1:
            return _checked(Fraction(base) ** exponent)
        # Too many exact digits: a float says whether it is huge (refused) or tiny (fine).
    b, x = float(base), float(exponent)
    if b < 0 and not x.is_integer():
        raise _fail("result is not a real number")
    if b == 0 and x < 0:
        raise _fail("division by zero")
    try:
        return _checked(math.pow(b, x))
    except OverflowError:
        raise _fail("result too large (limit 1e100)") from None


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise _fail("division by zero")
    if isinstance(a, float) or isinstance(b, float):
        return _checked(a / b)
    return _checked(Fraction(a) / Fraction(b))


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise _fail("division by zero")
    return _checked(a // b)


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise _fail("division by zero (modulo)")
    return _checked(a % b)


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: _checked(a + b),
    ast.Sub: lambda a, b: _checked(a - b),
    ast.Mult: lambda a, b: _checked(a * b),
    ast.Div: _divide,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _power,
}
_REFUSED_BINARY = {
    ast.BitXor: "'^' is bitwise XOR in Python; use '**' for powers",
    ast.BitAnd: "bitwise operators are not supported",
    ast.BitOr: "bitwise operators are not supported",
    ast.LShift: "bit shifts are not supported",
    ast.RShift: "bit shifts are not supported",
    ast.MatMult: "'@' is not supported",
}


# -- functions ------------------------------------------------------------------
def _sqrt(x: Number) -> Number:
    if x < 0:
        raise _fail("math domain error (sqrt of a negative number)")
    if isinstance(x, int | Fraction):
        x = Fraction(x)
        num, den = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if num * num == x.numerator and den * den == x.denominator:
            return _checked(Fraction(num, den))
    return _checked(math.sqrt(x))


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return _checked(round(x))
    if not isinstance(ndigits, int) or abs(ndigits) > _MAX_DIGITS:
        raise _fail("round(x, n) needs an integer n between -100 and 100")
    return _checked(round(x, ndigits))


def _factorial(n: Number) -> Number:
    if not isinstance(n, int) or n < 0:
        raise _fail("factorial needs a non-negative integer")
    if n > 70:  # 70! > 1e100
        raise _fail("result too large (limit 1e100)")
    return _checked(math.factorial(n))


def _gcd(*args: Number) -> Number:
    if not all(isinstance(a, int) for a in args):
        raise _fail("gcd needs integers")
    return _checked(math.gcd(*args))


def _float_fn(fn: Callable[..., float]) -> Callable[..., Number]:
    def call(*args: Number) -> Number:
        try:
            return _checked(fn(*(float(a) for a in args)))
        except ValueError:
            raise _fail(f"math domain error in {fn.__name__}") from None
        except OverflowError:
            raise _fail("result too large (limit 1e100)") from None

    return call


def _exact_or_float(fn: Callable[..., Any]) -> Callable[..., Number]:
    def call(*args: Number) -> Number:
        return _checked(fn(*args))

    return call


def _min_max(fn: Callable[..., Any]) -> Callable[..., Number]:
    def call(*args: Number) -> Number:
        if not args:
            raise _fail(f"{fn.__name__}() needs at least one argument")
        return _checked(fn(args))

    return call


#: The functions an expression may call: name -> (implementation, allowed argument counts).
FUNCTIONS: dict[str, tuple[Callable[..., Number], tuple[int, ...] | None]] = {
    "sqrt": (_sqrt, (1,)),
    "abs": (_exact_or_float(abs), (1,)),
    "round": (_round, (1, 2)),
    "min": (_min_max(min), None),
    "max": (_min_max(max), None),
    "floor": (_exact_or_float(math.floor), (1,)),
    "ceil": (_exact_or_float(math.ceil), (1,)),
    "factorial": (_factorial, (1,)),
    "gcd": (_gcd, None),
    "exp": (_float_fn(math.exp), (1,)),
    "log": (_float_fn(math.log), (1, 2)),
    "log2": (_float_fn(math.log2), (1,)),
    "log10": (_float_fn(math.log10), (1,)),
    "sin": (_float_fn(math.sin), (1,)),
    "cos": (_float_fn(math.cos), (1,)),
    "tan": (_float_fn(math.tan), (1,)),
    "asin": (_float_fn(math.asin), (1,)),
    "acos": (_float_fn(math.acos), (1,)),
    "atan": (_float_fn(math.atan), (1,)),
}


# -- the walk -----------------------------------------------------------------------
def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(f"unsupported constant {value!r}: only numbers are allowed")
        return _checked(value)
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op in _REFUSED_BINARY:
            raise _fail(_REFUSED_BINARY[op])
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _BINARY[op](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand)
        if isinstance(node.op, ast.USub):
            return _checked(-operand)
        if isinstance(node.op, ast.UAdd):
            return _checked(+operand)
        raise _fail(f"unsupported operator {type(node.op).__name__}")
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise _fail(f"{node.id} is a function: call it, e.g. {node.id}(2)")
        raise _fail(f"unknown name {node.id!r}; allowed: {', '.join([*CONSTANTS, *FUNCTIONS])}")
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            raise _fail("attribute access is not allowed")
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            what = f"{node.func.id!r}" if isinstance(node.func, ast.Name) else "this expression"
            raise _fail(f"cannot call {what}; allowed functions: {', '.join(FUNCTIONS)}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _fail("function arguments must be plain positional numbers")
        fn, counts = FUNCTIONS[node.func.id]
        if counts is not None and len(node.args) not in counts:
            expected = " or ".join(map(str, counts))
            raise _fail(f"{node.func.id}() takes {expected} argument(s), got {len(node.args)}")
        return fn(*(_evaluate(a) for a in node.args))
    if isinstance(node, ast.Attribute):
        raise _fail("attribute access is not allowed")
    if isinstance(node, ast.Subscript):
        raise _fail("subscripts are not allowed")
    if isinstance(node, ast.Compare | ast.BoolOp):
        raise _fail("comparisons and boolean operators are not supported")
    raise _fail(f"unsupported syntax: {type(node).__name__}")


def _format(value: Number) -> str:
    if isinstance(value, Fraction):
        value = float(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression (see the module docstring).

    Raises:
        ToolError: the expression is invalid, not allowed, or past a limit; the
            message (starting ``"Error: "``) is meant for the model.
    """
    if not isinstance(expression, str):
        raise _fail("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise _fail(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip()
    if not text:
        raise _fail("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise _fail(f"invalid expression ({exc.msg})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _fail(f"invalid expression ({type(exc).__name__})") from None
    try:
        return _evaluate(tree)
    except ToolError:
        raise
    except RecursionError:
        raise _fail("expression nested too deeply") from None
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise _fail(f"{type(exc).__name__}: {exc}") from None


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports numbers, + - * / // % ** (power), parentheses, the constants pi, e and tau,
    and the functions sqrt, abs, round, min, max, floor, ceil, factorial, gcd, exp, log,
    log2, log10, sin, cos, tan, asin, acos, atan. Integer arithmetic is exact.

    Args:
        expression: The expression to evaluate, e.g. "(3 + 4) * 2 ** 10 / 7".
    """
    return _format(evaluate(expression))
