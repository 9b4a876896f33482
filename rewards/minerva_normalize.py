"""Minerva's final-answer normalisation (Lewkowycz et al., "Solving Quantitative
Reasoning Problems with Language Models", 2022, arXiv:2206.14858, appendix D.1), as
DAPO's scorer (``math_dapo``) applies it to the model's answer and the reference.

In order: keep what follows the last ``=``; apply :data:`SUBSTITUTIONS` (articles,
spaces, ``\\$`` and ``mbox`` go); delete every :data:`REMOVED_EXPRESSIONS` entry (unit
words, degree marks, thin spaces, ``\\text{}``-style leftovers); keep only the first
``$...$`` span when there is one; unwrap ``\\text{}``, ``\\textbf{}``, ``\\overline{}``
and ``\\boxed{}``; brace shorthand ``\\frac12`` -> ``\\frac{1}{2}`` and ``\\sqrt3`` ->
``\\sqrt{3}``; delete ``$``; drop the commas of a number made only of digits and commas;
strip surrounding whitespace. Plain substring edits, so ``"units"`` is also removed from
inside a word.
"""

from __future__ import annotations

import re

#: (old, new) substring replacements, applied in this order.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

#: Substrings deleted after the substitutions, in this order.
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
)

#: (pattern, replacement) rewrites after the deletions, in this order.
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(.*?)\$(.*?)\$(.*)", r"$\2$"),  # the first $...$ span only
        (r"\\text\{(.*?)\}", r"\1"),
        (r"\\textbf\{(.*?)\}", r"\1"),
        (r"\\overline\{(.*?)\}", r"\1"),
        (r"\\boxed\{(.*)\}", r"\1"),
        (r"frac([^{])(.)", r"frac{\1}{\2}"),
        (r"sqrt([^{])", r"sqrt{\1}"),
    )
)


def normalize_final_answer(answer: str) -> str:
    """Minerva's normal form of ``answer`` (module docstring)."""
    answer = answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    for pattern, replacement in _REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()
