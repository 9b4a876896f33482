"""The gsm8k reward: answer extraction, number formats, every gold answer of the shared sets."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from rewards.gsm8k import extract_answer, parse_number
from rlkit.data import shared_dataset_path
from rlkit.registry import REWARDS

gsm8k = rewards.get("gsm8k")


def score(response: str, truth: str, **options) -> float:
    return gsm8k(response, truth, **options)["score"]


def test_registered_under_its_name_and_reached_through_the_registry():
    assert "gsm8k" in rewards.names()
    assert REWARDS.get("gsm8k") is gsm8k


def test_strict_reads_the_number_after_the_last_hashes():
    text = "She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18"
    assert gsm8k(text, "18") == {"score": 1.0, "acc": 1.0, "pred": "18"}
    # Two answers: the last "####" counts (a corrected answer).
    assert score("#### 17\nwait, recheck.\n#### 18", "18") == 1.0
    assert score("#### 18\nno: #### 17", "18") == 0.0


def test_strict_without_hashes_scores_zero_but_flexible_takes_the_last_number():
    text = "9 eggs at $2 each make 18 dollars."
    assert score(text, "18") == 0.0
    assert score(text, "18", method="flexible") == 1.0
    # The last number, not the first: "2" appears before "18".
    assert score("I get 18, not 2", "18", method="flexible") == 0.0


@pytest.mark.parametrize(
    "written",
    ["18", "18.0", "18.00", "$18", "$ 18", "$18.00", "18."],
)
def test_number_formats_of_eighteen_all_match(written):
    assert score(f"#### {written}", "18") == 1.0


@pytest.mark.parametrize(
    "written,truth",
    [
        ("1,000", "1000"),
        ("1000", "1,000"),
        ("$1,234,567.50", "1234567.5"),
        ("-5", "-5"),
        ("-$5", "-5"),
        ("$-5", "-5"),
        ("0.5", ".5"),
    ],
)
def test_commas_dollars_signs_and_decimals_compare_by_value(written, truth):
    assert score(f"#### {written}", truth) == 1.0


def test_wrong_answers_get_format_score_and_missing_answers_zero():
    # verl's GSM8K default: format_score 0, score 1.
    assert score("#### 17", "18") == 0.0
    assert score("#### 17", "18", format_score=0.1) == 0.1
    assert score("no number here", "18", format_score=0.1) == 0.0
    assert score("#### 18", "18", score=2.0) == 2.0
    assert gsm8k("#### 17", "18", format_score=0.1)["acc"] == 0.0


def test_negative_is_not_positive_and_subtraction_is_not_a_sign():
    assert score("#### -18", "18") == 0.0
    # "x-5": the minus is subtraction, the number is 5.
    assert score("so y = x-5", "5", method="flexible") == 1.0


def test_parse_number_rejects_text_that_is_not_one_number():
    assert parse_number("1,000") == 1000
    assert parse_number("eighteen") is None
    assert parse_number("1 2") is None
    assert extract_answer("nothing", "flexible") is None


def test_bad_ground_truth_and_bad_method_raise_with_the_fix():
    with pytest.raises(ValueError, match="ground truth must be a number"):
        gsm8k("#### 18", "eighteen")
    with pytest.raises(ValueError, match="unknown gsm8k method"):
        gsm8k("#### 18", "18", method="loose")


def test_unknown_extra_fields_are_accepted_per_the_contract():
    assert score("#### 18", "18", data_source="gsm8k", response_length=12) == 1.0


def _format_number(n: int, commas: bool, dollar: bool, decimals: int) -> str:
    body = f"{abs(n):,}" if commas else str(abs(n))
    if decimals:
        body += "." + "0" * decimals
    sign = "-" if n < 0 else ""
    return f"{sign}${body}" if dollar else f"{sign}{body}"


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(min_value=-(10**9), max_value=10**9),
    commas=st.booleans(),
    dollar=st.booleans(),
    decimals=st.integers(min_value=0, max_value=3),
    method=st.sampled_from(["strict", "flexible"]),
)
def test_any_format_of_the_right_integer_scores_one_and_off_by_one_scores_zero(
    n, commas, dollar, decimals, method
):
    written = _format_number(n, commas, dollar, decimals)
    assert score(f"The total is computed.\n#### {written}", str(n), method=method) == 1.0
    wrong = _format_number(n + 1, commas, dollar, decimals)
    assert score(f"The total is computed.\n#### {wrong}", str(n), method=method) == 0.0


def _rows(split: str) -> list[dict]:
    lines = shared_dataset_path("gsm8k", split).read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("split,num_rows", [("train", 7473), ("test", 1319)])
def test_every_gold_answer_scores_one_and_plus_one_scores_zero(split, num_rows):
    rows = _rows(split)
    assert len(rows) == num_rows
    for row in rows:
        gold = row["answer"]
        assert score(f"Reasoning...\n#### {gold}", gold) == 1.0, row["id"]
        assert score(f"Reasoning...\n#### {int(gold) + 1}", gold) == 0.0, row["id"]


def test_reference_solutions_themselves_score_one():
    # The source solutions end in "#### N" with <<calc>> annotations before it.
    for row in _rows("test"):
        assert score(row["solution"], row["answer"]) == 1.0, row["id"]
