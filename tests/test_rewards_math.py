"""The math reward (math-verify): extraction, equivalence, every MATH-500 / AIME gold answer."""

import json
import re
import threading
import time

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from math_verify import parse

import rewards
from rewards.math_answer import _PRED_CONFIGS, extract_answer
from rlkit.data import shared_dataset_path

math_reward = rewards.get("math")


def score(response: str, truth: str, **options) -> float:
    return math_reward(response, truth, **options)["score"]


def boxed(answer: str) -> str:
    """A response ending the way a model writes it."""
    return f"Putting it together, so the answer is $\\boxed{{{answer}}}$."


@pytest.mark.parametrize(
    "written,truth",
    [
        ("\\dfrac{1}{2}", "\\frac12"),  # fraction spellings
        ("0.5", "\\frac{1}{2}"),  # decimal vs fraction
        ("2\\sqrt{3}", "\\sqrt{12}"),  # radicals
        ("[2,5)", "[2,5)"),  # intervals
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),  # tuples
        ("025", "25"),  # AIME leading zeros, both ways
        ("25", "025"),
        ("x = 3", "3"),  # an equation against its value
        ("C", "\\text{(C)}"),  # a choice letter
        ("10,080", "10,\\!080"),  # thousands separators
    ],
)
def test_equivalent_answers_score_one(written, truth):
    assert score(boxed(written), truth) == 1.0


@pytest.mark.parametrize(
    "written,truth",
    [
        ("(2,5)", "[2,5)"),  # open vs half-open interval
        ("\\frac{1}{3}", "\\frac{1}{2}"),
        ("\\sqrt{13}", "\\sqrt{12}"),
        ("-25", "25"),
    ],
)
def test_different_answers_score_zero(written, truth):
    assert score(boxed(written), truth) == 0.0


def test_strict_needs_a_box_or_final_answer_phrase_flexible_does_not():
    assert score("The final answer is $25$.", "25") == 1.0
    assert score("I computed 25", "25") == 0.0
    assert score("I computed 25", "25", method="flexible") == 1.0


def test_result_reports_accuracy_and_the_extracted_answer():
    assert math_reward(boxed("\\frac{2}{4}"), "\\frac12") == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "\\frac{2}{4}",
    }
    assert math_reward("no answer", "1") == {"score": 0.0, "acc": 0.0, "pred": ""}
    wrong = math_reward(boxed("2"), "1", format_score=0.1)
    assert wrong["score"] == 0.1 and wrong["acc"] == 0.0


def test_astronomically_large_answers_are_rejected_fast():
    # SymPy would evaluate 9^(9^(9^9)) inside one C call for minutes; it is refused.
    start = time.monotonic()
    assert score(boxed("9^{9^{9^{9}}}"), "5") == 0.0
    assert score(boxed("(10^{8})!"), "5") == 0.0
    assert time.monotonic() - start < 5.0
    # Large but reasonable numbers still compare: 2^100 = 1267650600228229401496703205376.
    assert score(boxed("2^{100}"), "1267650600228229401496703205376") == 1.0


def test_works_off_the_main_thread():
    # math-verify's own signal-based timeout would raise here; ours is off in-process.
    out = {}
    thread = threading.Thread(target=lambda: out.update(s=score(boxed("\\frac{4}{8}"), "0.5")))
    thread.start()
    thread.join(timeout=60)
    assert out == {"s": 1.0}


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="unknown math method"):
        math_reward(boxed("1"), "1", method="loose")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=999), width=st.integers(min_value=1, max_value=3))
def test_aime_answers_with_leading_zeros_match_the_integer(n, width):
    written = f"{n:0{width}d}"  # 7 -> "7", "07", "007"
    assert score(boxed(written), str(n)) == 1.0
    assert score(boxed(str(n)), f"{n:03d}") == 1.0
    assert score(boxed(f"{n + 1:0{width}d}"), str(n)) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=-(10**6), max_value=10**6),
    style=st.sampled_from(["plain", "comma", "latex_comma", "dollar", "decimal"]),
)
def test_number_formats_inside_a_box_match_the_integer(n, style):
    written = {
        "plain": str(n),
        "comma": f"{n:,}",  # -1,234
        "latex_comma": f"{n:,}".replace(",", "{,}"),  # -1{,}234
        "dollar": f"\\${n}",
        "decimal": f"{n}.0",
    }[style]
    assert score(boxed(written), str(n)) == 1.0


# -- every gold answer of the shared MATH-500 and AIME sets ------------------
def _rows(name: str) -> list[dict]:
    lines = shared_dataset_path(name).read_text().splitlines()
    return [json.loads(line) for line in lines]


# The 11 MATH-500 golds without a digit cannot take the +1 perturbation; each
# gets a hand-picked different answer instead.
NO_DIGIT_PERTURBATIONS = {
    "p - q": "p + q",
    "\\text{Evelyn}": "\\text{Bob}",
    "\\pi": "2\\pi",
    "\\cot x": "\\tan x",
    "\\text{east}": "\\text{west}",
    "\\text{even}": "\\text{odd}",
    "\\text{(C)}": "\\text{(D)}",
    "\\text{(E)}": "\\text{(A)}",
    "\\text{(B)}": "\\text{(C)}",
    "\\text{ellipse}": "\\text{parabola}",
    "\\text{Navin}": "\\text{Luna}",
}


def perturb(gold: str) -> str:
    """A surely non-equivalent answer: the first integer in the gold plus one.

    The first (not the last) integer, because the last one is often a base
    subscript (``52_8``) or a unit exponent (``cm^2``) that does not change the value.
    """
    if gold in NO_DIGIT_PERTURBATIONS:
        return NO_DIGIT_PERTURBATIONS[gold]
    match = re.search(r"\d+", gold)
    assert match is not None, f"gold {gold!r} needs an explicit perturbation"
    return gold[: match.start()] + str(int(match.group()) + 1) + gold[match.end() :]


def test_math500_every_gold_scores_one_and_every_perturbation_zero():
    rows = _rows("math500")
    assert len(rows) == 500
    assert sum(not re.search(r"\d", r["answer"]) for r in rows) == len(NO_DIGIT_PERTURBATIONS)
    for row in rows:
        gold, wrong = row["answer"], perturb(row["answer"])
        assert score(boxed(gold), gold) == 1.0, (row["id"], gold)
        assert score(boxed(wrong), gold) == 0.0, (row["id"], gold, wrong)
        # The perturbation must parse to mathematics, so 0 means "not equivalent",
        # not "could not read the answer".
        parsed = parse(
            boxed(wrong), extraction_config=_PRED_CONFIGS["strict"], parsing_timeout=None
        )
        assert parsed and isinstance(parsed[0], sympy.Basic | sympy.MatrixBase), row["id"]
        assert extract_answer(boxed(wrong)), row["id"]


@pytest.mark.parametrize("name", ["aime2024", "aime2025"])
def test_aime_every_gold_scores_one_also_zero_padded_and_plus_one_scores_zero(name):
    rows = _rows(name)
    assert len(rows) == 30
    for row in rows:
        gold = row["answer"]
        assert score(boxed(gold), gold) == 1.0, row["id"]
        assert score(boxed(f"{int(gold):03d}"), gold) == 1.0, row["id"]  # "025" for 25
        assert score(boxed(str(int(gold) + 1)), gold) == 0.0, row["id"]
