"""Crafted responses for comparing rlkit's math rewards with verl 0.9.1's, built
deterministically from the real gold answers of AIME 2024/2025, MATH-500 and GSM8K in the
suite's data folder (``$RLKIT_DATA_DIR``, set by ``tests/conftest.py``).

Each case is ``(data_source, response, ground_truth)``. The variants cover the forms
models write: ``Answer:`` lines (units, ``$...$``, ``\\text{}``, commas, spaces, repeated
lines, other cases), ``\\boxed{}`` (nested braces, ``\\boxed`` with a space, ``\\fbox``,
no closing brace), wrong and missing answers, answers at the edges of the 300- and
100-character windows, equivalent spellings (fractions, ``\\dfrac``, ``\\sqrt3``,
degrees, percentages, leading zeros), empty strings and non-ASCII text.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

Case = tuple[str, str, str]

MATH_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime2025", "aime")
HENDRYCKS_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
)
PRIME_SOURCES = (
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
GEO3K_SOURCES = ("hiyouga/geometry3k",)
GSM8K_SOURCES = ("openai/gsm8k",)


@cache
def golds(name: str) -> tuple[str, ...]:
    """The ``answer`` column of ``<name>/test.jsonl`` in the data folder."""
    path = Path(os.environ["RLKIT_DATA_DIR"]) / name / "test.jsonl"
    return tuple(json.loads(line)["answer"] for line in path.read_text().splitlines() if line)


def wrong(gold: str) -> str:
    """A different answer: the first integer of ``gold`` plus one, else ``gold + 1``."""
    found = re.search(r"\d+", gold)
    if found is None:
        return gold + "+1"
    return gold[: found.start()] + str(int(found.group()) + 1) + gold[found.end() :]


def spellings(gold: str) -> list[str]:
    """Other ways to write ``gold`` (some equivalent under a rule, some not)."""
    forms = [
        gold.replace("\\frac", "\\dfrac"),
        gold.replace("\\frac", "\\tfrac"),
        re.sub(r"\\frac\{(\d)\}\{(\d)\}", r"\\frac\1\2", gold),
        re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"\1/\2", gold),
        re.sub(r"\\sqrt\{(\w)\}", r"\\sqrt\1", gold),
        gold.replace(" ", ""),
        gold.replace(",", ", "),
        f" {gold} ",
        f"0{gold}",
        f"{gold}^\\circ",
        f"{gold}^{{\\circ}}",
        f"{gold}\\%",
        f"{gold}%",
        f"\\${gold}",
        f"x = {gold}",
        f"{gold} \\text{{ cm}}",
        f"\\text{{{gold}}}",
        f"\\left( {gold} \\right)",
        f"{{{gold}}}",
        f"{gold}.",
    ]
    if gold.isdigit() and len(gold) > 3:
        forms.append(f"{int(gold):,}")
        forms.append(f"{int(gold):,}".replace(",", "{,}"))
        forms.append(f"{int(gold):,}".replace(",", ",\\!"))
    if gold == "\\frac{1}{2}":
        forms += ["0.5", ".5", "1/2", "\\frac12"]
    return forms


def _answer_lines(gold: str) -> list[str]:
    bad = wrong(gold)
    return [
        f"Let me think step by step.\nAnswer: {gold}",
        f"Answer: ${gold}$",
        f"Answer: \\boxed{{{gold}}}",
        f"answer: {gold}",
        f"ANSWER : {gold}",
        f"Final Answer:{gold}",
        f"Answer: {gold} units",
        f"Answer: {gold} degrees",
        f"Answer: \\text{{{gold}}}",
        f"Answer: \\textbf{{{gold}}}",
        f"Answer: x = {gold}",
        f"Answer: an {gold}",
        f"Answer: {bad}\nAnswer: {gold}",
        f"Answer: {gold}\nAnswer: {bad}",
        f"Answer: {bad}",
        f"Answer:\n{gold}",
        f"Answer: {gold}\n\nThat is all.",
        f"The answer is {gold}.",
        f"Answer\uff1a{gold}",
        f"Answer: {gold} \u2713",
        f"\u7b54\u6848 Answer: {gold}",
    ]


def _boxes(gold: str) -> list[str]:
    bad = wrong(gold)
    return [
        f"So the answer is $\\boxed{{{gold}}}$.",
        f"\\boxed{{{gold}}}",
        f"\\boxed{{ {gold} }}",
        f"\\boxed {gold}$ done",
        f"\\boxed {gold}",
        f"\\fbox{{{gold}}}",
        f"\\boxed{{{gold}",
        f"\\boxed{{{{{gold}}}}}",
        f"\\boxed{{\\boxed{{{gold}}}}}",
        f"\\boxed{{{bad}}} then \\boxed{{{gold}}}",
        f"\\boxed{{{gold}}} then \\boxed{{{bad}}}",
        f"\\boxed{{{bad}}}",
        f"\\boxed\n{{{gold}}}",
        f"x = \\boxed{{{gold}}}",
        f"\\boxed{{{gold}}} \\text{{ cm}}",
        f"Final: \\boxed{{{gold}}}\u3002",
    ]


def _windows(gold: str) -> list[str]:
    """The answer pushed across the 300- and 100-character edges."""
    out = []
    line = f"Answer: {gold}"
    for tail in (300 - len(line) - 2, 300 - len(line), 300 - len(line) + 2, 300):
        out.append("x" * 50 + "\n" + line + "\n" + "y" * max(tail - 1, 0))
    box = f"\\boxed{{{gold}}}"
    for tail in (100 - len(box) - 1, 100 - len(box), 100 - len(box) + 1, 150):
        out.append("z" * 400 + box + "." * max(tail, 0))
    return out


def _fixed() -> list[str]:
    return [
        "",
        " ",
        "\n",
        "Answer:",
        "Answer: ",
        "Answer: [INVALID]",
        "\\boxed{}",
        "\\boxed{",
        "\\boxed",
        "}}}{{{",
        "Answer: \\frac",
        "Answer: \\sqrt",
        "\\boxed{\\frac}",
        "\\boxed{\\sqrt}",
        "\\boxed{1 \\text{ m} \\text{ s}}",
        "\u00e9\u00e8\u00ea \u4e2d\u6587 \U0001f600",
        "<think>hmm</think> \\boxed{}",
        "answer is \u0130\u0130\u0130 42",
    ]


def _spread(sources: tuple[str, ...], responses: list[str], gold: str, start: int) -> list[Case]:
    return [(sources[(start + i) % len(sources)], r, gold) for i, r in enumerate(responses)]


def _family(
    sources: tuple[str, ...], gold_list: tuple[str, ...], make: Callable[[str], list[str]]
) -> Iterator[Case]:
    for index, gold in enumerate(gold_list):
        yield from _spread(sources, make(gold), gold, index)
    for index, response in enumerate(_fixed()):
        yield from _spread(sources, [response], gold_list[index % len(gold_list)], index)


def _math_dapo_responses(gold: str) -> list[str]:
    return (
        _answer_lines(gold)
        + [f"Answer: {form}" for form in spellings(gold)]
        + _boxes(gold)[:8]
        + _windows(gold)
    )


def _hendrycks_responses(gold: str) -> list[str]:
    return _boxes(gold) + [f"\\boxed{{{form}}}" for form in spellings(gold)]


def _prime_responses(gold: str) -> list[str]:
    bad = wrong(gold)
    forms = spellings(gold)
    return [
        f"The answer is {gold}.",
        f"So the final answer is $\\boxed{{{gold}}}$. Done",
        f"answer: {bad}",
        f"Thus x = {forms[3]}",
        f"We get {forms[0]}",
        f"\\boxed{{{forms[9]}}}",
        f"Answer: {forms[11]}",
        f"{gold} is the answer",
    ]


def _geo3k_responses(gold: str) -> list[str]:
    bad = wrong(gold)
    return [
        f"<think>reasoning</think> The answer is \\boxed{{{gold}}}.",
        f"\\boxed{{{gold}}}",
        f"<think>reasoning</think> \\boxed{{{bad}}}",
        f"<think>a\nb</think>\n\\boxed{{{gold}}}\n",
        f"<think>x</think> {gold}",
        f"\\boxed{{{gold}",
        f"<think></think>\\boxed{{{spellings(gold)[0]}}}",
    ]


def _gsm8k_responses(gold: str) -> list[str]:
    return [f"So #### {gold}", f"#### {wrong(gold)}", f"####{gold}", f"#### {gold}.0"]


def math_dapo_cases() -> list[Case]:
    return list(
        _family(
            MATH_DAPO_SOURCES,
            golds("aime2024") + golds("aime2025") + golds("math500"),
            _math_dapo_responses,
        )
    )


def hendrycks_cases() -> list[Case]:
    return list(_family(HENDRYCKS_SOURCES, golds("math500"), _hendrycks_responses))


#: (response, reference) pairs for PRIME's rarer paths: pi, matrices, points, intervals,
#: bases, money, percentages, mixed numbers, number words, values Python cannot convert.
PRIME_SPECIALS: tuple[tuple[str, str], ...] = (
    ("answer: 2\\pi", "2\\pi"),
    ("answer: 6.2832", "2\\pi"),
    ("answer: 6.28", "2\\pi"),
    ("answer: \\pi/2", "\\frac{\\pi}{2}"),
    ("answer: 1.5708", "\\frac{\\pi}{2}"),
    ("answer: \\pi", "3.14"),
    ("answer: 2\\pi + 1", "7.28"),
    ("answer: (\\pi, 2\\pi)", "(3.14, 6.28)"),
    ("answer: [1, 2]", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("answer: [[1], [2]]", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("answer: [a, b]", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("answer: Matrix([[1], [2]])", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("answer: Matrix([[1], [3]])", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("answer: Matrix([[1, 2]])", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}"),
    ("answer: Point(1, 2)", "(1, 2)"),
    ("answer: Point(1, 3)", "(1, 2)"),
    ("answer: Point(1, 2)", ""),
    ("answer: Interval(0, 1)", "[0, 1]"),
    ("answer: Interval.Ropen(0, 1)", "[0, 1)"),
    ("answer: Interval.open(0, 1)", "[0, 1]"),
    ("answer: (0, 1]", "(0, 1]"),
    ("answer: [0, 1)", "(0, 1)"),
    ("answer: (1, 2)", "(1,2)"),
    ("answer: (2, 1)", "(1,2)"),
    ("answer: 1, 2, 3", "1,2,3"),
    ("answer: 1, 2", "1,2,3"),
    ("answer: 1011_2", "11"),
    ("answer: 1011_2", "1011_2"),
    ("answer: x_2", "11"),
    ("answer: 11", "1011_2"),
    ("answer: $5", "5"),
    ("answer: $5.50", "5.5"),
    ("answer: 50%", "50"),
    ("answer: 50\\%", "0.5"),
    ("answer: 0.5", "50"),
    ("answer: 7 3/4", "31/4"),
    ("answer: 7\\frac{3}{4}", "\\frac{31}{4}"),
    ("answer: 2 million", "2000000"),
    ("answer: 1,000", "1000"),
    ("answer: 1{,}000", "1000"),
    ("answer: 1,000,000", "10^6"),
    ("answer: 1e400", "1e400"),
    ("answer: inf", "\\infty"),
    ("answer: nan", "nan"),
    ("answer: x^2 + 2x + 1", "(x+1)^2"),
    ("answer: x^2 + 2x", "(x+1)^2"),
    ("answer: 2^{10}", "1024"),
    ("answer: \\sqrt{2}/2", "\\frac{\\sqrt2}{2}"),
    ("answer: 2/4", "1/2"),
    ("answer: 3 degrees", "3^\\circ"),
    ("answer: 5 cm^2", "5"),
    ("answer: \\text{Evelyn}", "\\text{Evelyn}"),
    ("answer: evelyn", "\\text{Evelyn}"),
    ("answer: 3 or 5", "3, 5"),
    ("answer: -2 + 7i", "-2+7i"),
    ("The value must be 12. Then we are done", "12"),
    ("It is 5. Thus we get 6", "6"),
    ("answer is \u0130\u0130 12", "12"),
    ("answer: \\frac{1}{0}", "1"),
    ("answer: 1/0", "1"),
    ("answer: 9^9^9", "1"),
    ("answer: " + "1" * 1200, "1"),
)


def prime_cases() -> list[Case]:
    chosen = golds("aime2024") + golds("math500")[::4]
    cases = list(_family(PRIME_SOURCES, chosen, _prime_responses))
    cases += _spread(PRIME_SOURCES, [], "", 0)
    for index, gold in enumerate(golds("math500")[::3]):
        forms = [f"answer: {form}" for form in spellings(gold)]
        cases += _spread(PRIME_SOURCES, forms, gold, index)
    for index, (response, gold) in enumerate(PRIME_SPECIALS):
        cases += [(PRIME_SOURCES[(index + k) % len(PRIME_SOURCES)], response, gold) for k in (0, 1)]
    return cases


def geo3k_cases() -> list[Case]:
    chosen = golds("aime2025") + golds("math500")[1::5]
    return list(_family(GEO3K_SOURCES, chosen, _geo3k_responses))


def gsm8k_cases() -> list[Case]:
    return list(_family(GSM8K_SOURCES, golds("gsm8k")[:300], _gsm8k_responses))
