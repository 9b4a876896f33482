"""The `weighted` reward: score = sum of weight x term score, every term's score kept
under `weighted/<name>` and logged as its mean by the trainer's scoring."""

from __future__ import annotations

import textwrap

import pytest

import rewards
from rewards.context import RewardContext
from rewards.weighted import parse_terms
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import ScoredRollout, score_rollout
from tests.experiment_factory import small_experiment

FMT = '''
def fmt(response, ground_truth, *, marker="####", **extra):
    """1 when the response writes the marker."""
    return float(marker in response)


def reads_prompt(response, ground_truth, *, prompt, **extra):
    return {"score": float(len(prompt)), "prompt_len": float(len(prompt))}
'''


class CharTokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(i) for i in row) for row in ids]


def _row(text: str, prompt_index: int) -> Trajectory:
    ids = [ord(c) for c in text]
    return Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), [0] * len(ids), prompt_index)


@pytest.fixture
def fmt_file(tmp_path):
    path = tmp_path / "fmt.py"
    path.write_text(textwrap.dedent(FMT))
    return path


def test_the_score_is_the_weighted_sum_and_each_term_keeps_its_own_score(fmt_file):
    terms = [
        {"reward": "gsm8k", "weight": 1.0},
        {"reward": f"{fmt_file}:fmt", "weight": 0.2},
        {"reward": "length_penalty", "weight": 0.5, "options": {"max_response_length": 8}},
    ]
    weighted = rewards.get("weighted")
    out = weighted("so #### 18", "18", terms=terms, response_length=4)
    # gsm8k 1.0 (18 = 18), fmt 1.0 ("####" present), length -min(4/8, 1) = -0.5:
    # 1.0 * 1.0 + 0.2 * 1.0 + 0.5 * -0.5 = 1.0 + 0.2 - 0.25 = 0.95.
    assert out["score"] == pytest.approx(0.95, abs=1e-12)
    assert out == {
        "score": out["score"],
        "weighted/gsm8k": 1.0,
        "weighted/gsm8k/acc": 1.0,
        "weighted/gsm8k/pred": "18",
        "weighted/fmt": 1.0,
        "weighted/length_penalty": -0.5,
        "acc": 1.0,  # the first term that reports acc: gsm8k's
    }
    wrong = weighted("18", "17", terms=terms, response_length=8)
    # gsm8k: no "####" -> 0 (acc 0), fmt 0, length -min(8/8, 1) = -1: 0 + 0 + 0.5 * -1 = -0.5.
    assert wrong["score"] == -0.5 and wrong["acc"] == 0.0


def test_a_terms_options_reach_it_and_win_over_per_sample_fields(fmt_file):
    terms = [{"reward": f"{fmt_file}:fmt", "weight": 2.0, "options": {"marker": "ANSWER"}}]
    out = rewards.get("weighted")("ANSWER: 3", "3", terms=terms, marker="####")
    assert out == {"score": 2.0, "weighted/fmt": 1.0}  # 2.0 x 1.0, the term's marker


def test_terms_get_the_context_fields_their_signature_names(fmt_file):
    context = RewardContext(response="x", ground_truth="y", prompt="abcd")
    terms = [{"reward": f"{fmt_file}:reads_prompt", "weight": 0.5, "name": "p"}]
    out = rewards.score_batch("weighted", ["x"], ["y"], [{"terms": terms}], contexts=[context])
    assert out.num_errors == 0, out.infos
    # len("abcd") = 4, weight 0.5 -> 2.0.
    assert out.scores == [2.0]
    assert out.infos[0] == {"weighted/p": 4.0, "weighted/p/prompt_len": 4.0}


def test_term_names_default_to_the_reward_or_function_name_and_must_be_distinct():
    terms = parse_terms(["gsm8k", {"reward": "pkg.mod:judge"}, {"reward": "a/b/c.py:fmt"}])
    assert [(t.name, t.weight) for t in terms] == [("gsm8k", 1.0), ("judge", 1.0), ("fmt", 1.0)]
    with pytest.raises(ValueError, match=r"\['format'\] are named twice"):
        parse_terms(["format", {"reward": "format", "options": {"score": 2.0}}])
    named = parse_terms(["format", {"reward": "format", "name": "format_strict"}])
    assert [t.name for t in named] == ["format", "format_strict"]


@pytest.mark.parametrize(
    ("terms", "error", "fragment"),
    [
        ([], TypeError, "a non-empty list"),
        ("gsm8k", TypeError, "a non-empty list"),
        ([{"weight": 1.0}], TypeError, "weighted term 0"),
        ([{"reward": "gsm8k", "wieght": 1.0}], ValueError, "unknown keys ['wieght']"),
        ([{"reward": "gsm8k", "weight": "1"}], TypeError, "is not a number"),
        ([{"reward": "gsm8k", "weight": float("inf")}], ValueError, "is not finite"),
        ([{"reward": "gsm8k", "options": ["x"]}], TypeError, "options must be a dict"),
    ],
)
def test_malformed_terms_are_refused_with_the_term_named(terms, error, fragment):
    with pytest.raises(error) as info:
        parse_terms(terms)
    assert fragment in str(info.value)


def test_a_failing_term_fails_the_row_naming_the_term():
    terms = [{"reward": "gsm8k"}]
    out = rewards.score_batch("weighted", ["#### 3"], ["not a number"], [{"terms": terms}])
    assert out.num_errors == 1
    assert out.infos[0]["error"].startswith("RuntimeError: weighted term 'gsm8k' (gsm8k) raised")


def test_the_trainer_scoring_logs_each_terms_mean(fmt_file, tmp_path):
    terms = [{"reward": "exact_match", "weight": 1.0}, {"reward": f"{fmt_file}:fmt", "weight": 0.2}]
    cfg = small_experiment(
        tmp_path, tmp_path, data={"reward": "weighted", "reward_options": {"terms": terms}}
    )
    prompts = PromptSet(token_ids=[[1], [1]], ground_truths=["4", "9"], data_sources=["t", "t"])
    rows = [_row("4", 0), _row("#### 4", 0), _row("9", 1), _row("#### 8", 1)]
    scored = score_rollout(rows, prompts, CharTokenizer(), cfg, groups=[0, 0, 1, 1])
    # exact_match: "4"=="4" 1, "#### 4" 0, "9"=="9" 1, "#### 8" 0; fmt: 0, 1, 0, 1.
    # Scores 1.0 x exact + 0.2 x fmt: 1.0, 0.2, 1.0, 0.2.
    assert scored.scores == [1.0, 0.2, 1.0, 0.2]
    # Means over the 4 rows: fmt (0 + 1 + 0 + 1) / 4 = 0.5, exact (1 + 0 + 1 + 0) / 4 = 0.5;
    # acc is exact_match's: 0.5, and exact_match's own acc field too.
    assert scored.metrics["reward/weighted/fmt/mean"] == 0.5
    assert scored.metrics["reward/weighted/exact_match/mean"] == 0.5
    assert scored.metrics["reward/weighted/exact_match/acc/mean"] == 0.5
    assert scored.acc == [1.0, 0.0, 1.0, 0.0]
    assert scored.metrics["reward/num_errors"] == 0
    # The first group's rows only ("4" and "#### 4"): fmt (0 + 1) / 2 = 0.5; row 0 alone:
    # fmt 0 / 1 = 0, exact 1 / 1 = 1.
    first = scored.first_groups(1)
    assert first.metrics["reward/weighted/fmt/mean"] == 0.5
    only = scored.select([0])
    assert only.metrics["reward/weighted/fmt/mean"] == 0.0
    assert only.metrics["reward/weighted/exact_match/mean"] == 1.0
    assert only.metrics["reward/num_errors"] == 0  # counters are kept as they were


def test_field_means_are_recomputed_over_all_rows_when_rollouts_are_concatenated():
    def part(values: list[float], errors: float) -> ScoredRollout:
        n = len(values)
        return ScoredRollout(
            [_row("a", 0)] * n,
            [0] * n,
            [0.0] * n,
            [0.0] * n,
            ["t"] * n,
            None,
            {"reward/num_errors": errors},
            [{"weighted/f": v} for v in values],
        )

    one, two = part([1.0], errors=1.0), part([0.0, 0.0, 0.5], errors=2.0)
    assert one.metrics["reward/weighted/f/mean"] == 1.0
    both = ScoredRollout.concat([one, two])
    # Counters add up: 1 + 2 = 3; the mean is over the 4 rows: (1 + 0 + 0 + 0.5) / 4 = 0.375,
    # not the sum of the parts' means (1 + 0.5 / 3).
    assert both.metrics == {"reward/num_errors": 3.0, "reward/weighted/f/mean": 0.375}
