"""evaluate(): real generation with a tiny local model, real scoring, hand-computed metrics."""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoTokenizer

from rlkit.evaluation.eval_report import read_jsonl, summary_path
from rlkit.evaluation.evaluator import evaluate
from rlkit.evaluation.loaded_weights import LoadedModelWeights
from rlkit.registry import ROLLOUT_ENGINES


def accept_everything(response: str, ground_truth: str, **extra) -> float:
    return 1.0


def reject_everything(response: str, ground_truth: str, **extra) -> float:
    return 0.0


def correct_if_truth_is_yes(response: str, ground_truth: str, **extra) -> dict:
    return {"score": float(ground_truth == "yes"), "acc": float(ground_truth == "yes")}


def _problems(truths: list[str]) -> list[dict]:
    # Questions of different lengths, so length-sorted batching reorders them.
    return [
        {
            "id": f"p{i}",
            "prompt": [{"role": "user", "content": "1+" * (len(truths) - i) + "1="}],
            "ground_truth": truth,
            "data_source": "toy",
        }
        for i, truth in enumerate(truths)
    ]


@pytest.fixture(scope="module")
def engine_and_tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    weights = LoadedModelWeights(str(tiny_model_dir), dtype="float32", device="cpu")
    engine = ROLLOUT_ENGINES.get("hf")(
        model_path=str(tiny_model_dir), tokenizer=tokenizer, weights=weights, seed=0
    )
    return engine, tokenizer


def test_a_reward_accepting_everything_gives_accuracy_and_pass_at_k_of_one(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    report = evaluate(
        engine, tok, _problems(["a", "b", "c"]), reward=accept_everything, n=4,
        temperature=1.0, max_new_tokens=4, batch_size=2,
    )  # fmt: skip
    m = report.metrics
    assert m["accuracy"] == m["mean@4"] == 1.0
    assert m["pass@1"] == m["pass@2"] == m["pass@4"] == 1.0
    assert m["num_problems"] == 3 and m["n"] == 4
    assert all(len(p.responses) == 4 and all(p.correct) for p in report.problems)


def test_a_reward_rejecting_everything_gives_zero(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    report = evaluate(
        engine, tok, _problems(["a", "b"]), reward=reject_everything, n=2,
        temperature=1.0, max_new_tokens=3,
    )  # fmt: skip
    assert report.metrics["accuracy"] == report.metrics["pass@2"] == 0.0
    assert report.metrics["score/mean"] == 0.0


def test_results_stay_in_dataset_order_after_length_sorted_batching(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    truths = ["yes", "no", "no", "yes", "yes"]
    report = evaluate(
        engine, tok, _problems(truths), reward=correct_if_truth_is_yes, n=2,
        temperature=1.0, max_new_tokens=3, batch_size=2,
    )  # fmt: skip
    assert [p.id for p in report.problems] == ["p0", "p1", "p2", "p3", "p4"]
    assert [p.ground_truth for p in report.problems] == truths
    assert [p.correct for p in report.problems] == [[t == "yes"] * 2 for t in truths]
    # 3 of 5 problems always right, 2 always wrong: mean@2 = pass@1 = pass@2 = 3/5.
    assert report.metrics["accuracy"] == pytest.approx(0.6)
    assert report.metrics["pass@2"] == pytest.approx(0.6)


def test_pass_at_k_is_the_unbiased_estimator_over_problems(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    calls: dict[str, int] = {}

    def first_c_correct(response: str, ground_truth: str, **extra) -> float:
        # ground_truth "c=K": the first K of the problem's responses are correct.
        calls[ground_truth] = calls.get(ground_truth, 0) + 1
        return float(calls[ground_truth] <= int(ground_truth[2:]))

    report = evaluate(
        engine, tok, _problems(["c=1", "c=3"]), reward=first_c_correct, n=4,
        temperature=1.0, max_new_tokens=2, batch_size=1,
    )  # fmt: skip
    m = report.metrics
    assert [p.num_correct for p in report.problems] == [1, 3]
    assert m["mean@4"] == pytest.approx((1 / 4 + 3 / 4) / 2)  # 0.5
    assert m["pass@1"] == pytest.approx(0.5)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; c=3: n-c=1 < k, so 1.
    assert m["pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["pass@4"] == 1.0


def test_greedy_single_sample_is_reproducible_and_lengths_are_bounded(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    kwargs = dict(reward="exact_match", n=1, temperature=0.0, max_new_tokens=5, batch_size=3)
    first = evaluate(engine, tok, _problems(["2", "3", "4"]), **kwargs)
    second = evaluate(engine, tok, _problems(["2", "3", "4"]), **kwargs)
    assert [p.responses for p in first.problems] == [p.responses for p in second.problems]
    lengths = [x for p in first.problems for x in p.response_lengths]
    cut = [r == "length" for p in first.problems for r in p.finish_reasons]
    assert all(1 <= x <= 5 for x in lengths)
    assert first.metrics["response_length/clip_ratio"] == pytest.approx(sum(cut) / 3)
    assert first.metrics["response_length/mean"] == pytest.approx(sum(lengths) / 3)


def test_jsonl_has_one_record_per_problem_and_a_summary(engine_and_tokenizer, tmp_path):
    engine, tok = engine_and_tokenizer
    report = evaluate(
        engine, tok, _problems(["yes", "no", "yes"]), reward=correct_if_truth_is_yes, n=2,
        temperature=1.0, max_new_tokens=3,
    )  # fmt: skip
    path = report.write_jsonl(tmp_path / "out" / "eval.jsonl")
    records = read_jsonl(path)
    assert len(records) == 3
    assert [r["id"] for r in records] == ["p0", "p1", "p2"]
    assert [r["num_correct"] for r in records] == [2, 0, 2]
    for r in records:
        assert r["question"].endswith("1=") and r["question"] in r["prompt"]
        assert len(r["responses"]) == len(r["scores"]) == len(r["correct"]) == 2
        assert set(r) >= {"ground_truth", "finish_reasons", "response_lengths", "reward_infos"}
    summary = json.loads(summary_path(path).read_text())
    assert summary["metrics"]["accuracy"] == pytest.approx(2 / 3)
    assert summary["settings"]["n"] == 2


def test_summary_table_lists_accuracy_and_each_pass_at_k(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    report = evaluate(
        engine, tok, _problems(["a"]), reward=accept_everything, n=4, temperature=1.0,
        max_new_tokens=2,
    )  # fmt: skip
    table = report.summary_table()
    for row in ("accuracy (mean@4)", "pass@1", "pass@2", "pass@4", "reward errors / timeouts"):
        assert row in table


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 4, "temperature": 0.0}, "temperature > 0"),
        ({"n": 0}, "n (responses per problem) must be >= 1"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"batch_size": 0}, "batch_size and max_new_tokens must be >= 1"),
        ({"n": 2, "temperature": 1.0, "ks": [4]}, "within 1..n=2"),
    ],
)
def test_settings_that_cannot_work_raise_naming_the_fix(engine_and_tokenizer, kwargs, message):
    engine, tok = engine_and_tokenizer
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(engine, tok, _problems(["a"]), reward=accept_everything, **kwargs)


def test_an_unknown_reward_fails_before_generating(engine_and_tokenizer):
    from rlkit.registry import UnknownNameError

    engine, tok = engine_and_tokenizer
    with pytest.raises(UnknownNameError, match="gsm8k"):  # the message lists known rewards
        evaluate(engine, tok, _problems(["a"]), reward="gsm9k")


def test_an_empty_dataset_raises(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    with pytest.raises(ValueError, match="no problems"):
        evaluate(engine, tok, [], reward=accept_everything)


def test_a_failing_reward_scores_zero_and_is_counted(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer

    def broken(response: str, ground_truth: str, **extra) -> float:
        raise RuntimeError("bug in the reward")

    report = evaluate(engine, tok, _problems(["a", "b"]), reward=broken, max_new_tokens=2)
    assert report.metrics["reward/num_errors"] == 2
    assert report.metrics["accuracy"] == 0.0
    assert "bug in the reward" in report.problems[0].reward_infos[0]["error"]


def test_saved_responses_can_be_rescored_with_other_reward_options():
    from rlkit.evaluation.rescoring import rescore_records

    records = [
        {"responses": ["so 18", "#### 18"], "ground_truth": "18", "data_source": "gsm8k"},
        {"responses": ["it is 3", "#### 4"], "ground_truth": "3", "data_source": "gsm8k"},
    ]
    # strict reads only "#### N": problem 1 has 1 of 2 right, problem 2 has 0 of 2.
    strict = rescore_records(records, "gsm8k")
    assert strict["mean@2"] == pytest.approx((1 / 2 + 0) / 2)
    assert strict["pass@2"] == pytest.approx((1 + 0) / 2)
    # flexible reads the last number: 2 of 2 right, then 1 of 2 ("3" right, "4" wrong).
    flexible = rescore_records(records, "gsm8k", reward_options={"method": "flexible"})
    assert flexible["accuracy"] == pytest.approx((1 + 1 / 2) / 2)
    assert flexible["pass@2"] == 1.0


def test_intervals_are_over_problems_and_land_in_the_summary(engine_and_tokenizer, tmp_path):
    engine, tok = engine_and_tokenizer
    report = evaluate(
        engine, tok, _problems(["yes", "no", "no", "yes", "yes"]),
        reward=correct_if_truth_is_yes, n=2, temperature=1.0, max_new_tokens=2,
    )  # fmt: skip
    intervals = report.intervals()
    # Every problem is all right or all wrong (values 1, 0, 0, 1, 1): a proportion of 3 of 5,
    # so Wilson: center (0.6 + z²/10) / (1 + z²/5) = 0.556478, half width 0.325828.
    for name in ("accuracy", "pass@1", "pass@2"):
        est = intervals[name]
        assert (est.method, est.n, est.mean) == ("wilson", 5, pytest.approx(0.6))
        assert (est.low, est.high) == pytest.approx((0.230724, 0.882379), abs=1e-6)
    summary = json.loads(summary_path(report.write_jsonl(tmp_path / "e.jsonl")).read_text())
    assert summary["intervals"]["accuracy"]["low"] == pytest.approx(0.230724, abs=1e-6)
    assert summary["intervals"]["pass@2"]["method"] == "wilson"
    table = report.summary_table()
    assert "95% interval (over problems)" in table
    assert re.search(r"\| pass@2 +\| 0\.6000 \| \[0\.2307, 0\.8824\] \(wilson\) \|", table)


def test_two_reports_are_compared_problem_by_problem(engine_and_tokenizer):
    from rlkit.evaluation.comparison import compare_reports

    engine, tok = engine_and_tokenizer
    kwargs = dict(n=2, temperature=1.0, max_new_tokens=2)
    problems = _problems(["yes", "no", "no", "yes", "yes"])
    good = evaluate(engine, tok, problems, reward=correct_if_truth_is_yes, **kwargs)
    bad = evaluate(engine, tok, problems, reward=reject_everything, **kwargs)
    result = compare_reports(good, bad, names=("good", "bad"))
    # Differences per problem 1, 0, 0, 1, 1: mean 0.6, std sqrt(0.3) = 0.547723, t(0.975, 4)
    # = 2.776445, half width 2.776445 * 0.547723 / sqrt 5 = 0.680087 -> [-0.080087, 1.280087];
    # t = 0.6 / 0.244949 = 2.449490, two-sided p (df 4) = 0.070484: 0 is inside.
    test = result.tests["accuracy"]
    assert result.num_problems == 5 and result.means["accuracy"] == pytest.approx((0.6, 0.0))
    assert (test.difference.low, test.difference.high) == pytest.approx(
        (-0.080087, 1.280087), abs=1e-6
    )
    assert test.p_value == pytest.approx(0.070484, abs=1e-6)
    assert set(result.tests) == {"accuracy", "pass@1", "pass@2"}
    assert "| accuracy | 0.6000 | 0.0000 | +0.6000 | [-0.0801, 1.2801] | 0.0705 |" in result.table()
    assert "not distinguishable (interval includes 0)" in result.table()
    with pytest.raises(ValueError, match="different problems"):
        compare_reports(
            good, evaluate(engine, tok, problems[:3], reward=reject_everything, **kwargs)
        )
