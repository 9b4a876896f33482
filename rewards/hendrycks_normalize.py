"""The answer normalisation of the MATH benchmark's equivalence check (Hendrycks et al.,
"Measuring Mathematical Problem Solving With the MATH Dataset", NeurIPS 2021,
arXiv:2103.03874; its ``is_equiv``), as verl's ``math_reward`` and PRIME's grader use it.

Two answers are equivalent when they normalise to the same string. The normalisation
removes line breaks, ``\\!``, ``\\left``/``\\right``, degree marks, ``\\$``, percent
signs and a trailing unit written as ``\\text{ unit}``; reads ``k = 3`` as ``3`` (a
left side of at most two characters); writes ``\\sqrt3`` as ``\\sqrt{3}``,
``\\frac12`` as ``\\frac{1}{2}``, ``0.5`` and ``1/2`` as ``\\frac{1}{2}``; and drops
spaces. Some inputs cannot be normalised (two ``\\text{ `` units, a trailing ``\\sqrt``
or ``\\frac`` with nothing after it): :func:`normalize` raises
:class:`NotNormalizable` for them and the callers compare the raw strings instead,
as the benchmark's code does.
"""

from __future__ import annotations

#: Plain substring edits applied in order before the structural fixes.
_REMOVED = ("\n", "\\!")
_REPLACED = (("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"))
_DROPPED = ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$")
_UNIT_MARK = "\\text{ "


class NotNormalizable(ValueError):
    """The benchmark's normalisation fails on this string."""


def _drop_right_unit(text: str) -> str:
    """``3 \\text{ cm}`` -> ``3 ``: a ``\\text{ `` (with a space) only ever starts a unit."""
    if _UNIT_MARK not in text:
        return text
    before, *rest = text.split(_UNIT_MARK)
    if len(rest) != 1:
        raise NotNormalizable(f"more than one {_UNIT_MARK!r} unit")
    return before


def _brace_sqrt(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``: the one character after a bare ``\\sqrt`` is its argument."""
    head, *pieces = text.split("\\sqrt")
    out = [head]
    for piece in pieces:
        if not piece:
            raise NotNormalizable("\\sqrt with nothing after it")
        out.append("\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:]))
    return "".join(out)


def _brace_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; a ``\\frac``
    followed by a single character leaves the whole string as it was."""
    head, *pieces = text.split("\\frac")
    out = [head]
    for piece in pieces:
        if not piece:
            raise NotNormalizable("\\frac with nothing after it")
        if piece[0] == "{":
            out.append("\\frac" + piece)
            continue
        if len(piece) < 2:
            return text
        numerator, second, rest = piece[0], piece[1], piece[2:]
        if second == "{":  # \frac1{72}: only the numerator is bare
            out.append("\\frac{" + numerator + "}" + second + rest)
        else:
            out.append("\\frac{" + numerator + "}{" + second + "}" + rest)
    return "".join(out)


def _slash_to_frac(text: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers written canonically."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    if text != f"{numerator}/{denominator}":
        return text
    return "\\frac{" + str(numerator) + "}{" + str(denominator) + "}"


def normalize(text: str) -> str:
    """The MATH benchmark's normal form of an answer (module docstring).

    Raises:
        NotNormalizable: the benchmark's normalisation fails on ``text``.
    """
    for piece in _REMOVED:
        text = text.replace(piece, "")
    for old, new in _REPLACED:
        text = text.replace(old, new)
    for piece in _DROPPED:
        text = text.replace(piece, "")
    text = _drop_right_unit(text)
    text = text.replace("\\\\%", "").replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        text = sides[1]
    text = _brace_sqrt(text).replace(" ", "")
    text = _brace_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def equivalent(answer: str, reference: str) -> bool:
    """Whether two answers have the same normal form; the raw strings are compared when
    either cannot be normalised."""
    try:
        return normalize(answer) == normalize(reference)
    except NotNormalizable:
        return answer == reference
