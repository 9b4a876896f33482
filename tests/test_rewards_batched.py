"""A batched reward scores a whole step's responses in one call, and its failures are
counted like those of per-response rewards: every row it was to score."""

from __future__ import annotations

import textwrap
import time

import pytest

import rewards
from rewards.context import RewardContext
from rlkit.registry import REWARDS
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import score_rollout
from tests.experiment_factory import small_experiment

CALLS: list[tuple[list[RewardContext], dict]] = []


@pytest.fixture(autouse=True)
def _fresh_calls():
    CALLS.clear()
    yield
    CALLS.clear()


@rewards.batched
def judge(contexts, *, bonus=0.0, **options):
    """Scores each response by its length in characters, plus ``bonus``; records the call."""
    CALLS.append((list(contexts), dict(options, bonus=bonus)))
    return [
        {"score": len(c.response) + bonus, "long": float(len(c.response) > 2)} for c in contexts
    ]


@rewards.batched
def too_few(contexts, **options):
    return [1.0] * (len(contexts) - 1)


@rewards.batched
def not_a_list(contexts, **options):
    return 1.0


@rewards.batched
def raises(contexts, **options):
    raise ConnectionError("judge server down")


@rewards.batched
def sleeps(contexts, **options):
    time.sleep(5)
    return [1.0] * len(contexts)


@rewards.batched
def one_bad_item(contexts, **options):
    return [1.0, float("nan"), {"score": 0.5}]


def registered_judge(contexts, **options):
    return [float(c.ground_truth in c.response) for c in contexts]


class CharTokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(i) for i in row) for row in ids]


def _row(text: str, prompt_index: int) -> Trajectory:
    ids = [ord(c) for c in text]
    return Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), [0] * len(ids), prompt_index)


def test_score_batch_calls_a_batched_reward_once_with_every_context():
    out = rewards.score_batch(judge, ["a", "abc", "abcd"], ["x", "y", "z"])
    assert len(CALLS) == 1
    contexts, options = CALLS[0]
    assert [c.response for c in contexts] == ["a", "abc", "abcd"]
    assert [c.ground_truth for c in contexts] == ["x", "y", "z"]
    assert out.scores == [1.0, 3.0, 4.0]  # the lengths
    assert [i["long"] for i in out.infos] == [0.0, 1.0, 1.0]
    assert (out.num_errors, out.num_timeouts) == (0, 0)


def test_the_extras_shared_by_every_row_are_the_options_and_the_rest_go_to_the_contexts():
    extras = [{"bonus": 0.5, "data_source": "toy", "response_length": n} for n in (1, 2)]
    out = rewards.score_batch(judge, ["a", "ab"], ["x", "y"], extras)
    contexts, options = CALLS[0]
    assert options == {"bonus": 0.5}
    assert [(c.data_source, c.response_length) for c in contexts] == [("toy", 1), ("toy", 2)]
    assert out.scores == [1.5, 2.5]  # length + 0.5


def test_per_row_options_for_a_batched_reward_are_refused():
    extras = [{"bonus": 0.5}, {"bonus": 1.0}]
    with pytest.raises(ValueError, match=r"extras\[1\] differs from extras\[0\] in \['bonus'\]"):
        rewards.score_batch(judge, ["a", "ab"], ["x", "y"], extras)


def test_a_wrong_result_count_fails_every_row_with_a_message_naming_the_reward(caplog):
    out = rewards.score_batch(too_few, ["a", "b", "c"], ["a", "b", "c"])
    assert out.scores == [0.0, 0.0, 0.0]
    assert out.num_errors == 3 and out.num_timeouts == 0
    message = out.infos[0]["error"]
    assert message == (
        "batched reward 'too_few' returned 2 results for 3 contexts; "
        "it must return one result per context, in order"
    )
    assert "batched reward 'too_few' returned 2 results" in caplog.text  # one warning


def test_a_result_that_is_not_a_list_fails_every_row():
    out = rewards.score_batch(not_a_list, ["a", "b"], ["a", "b"])
    assert out.num_errors == 2
    assert "returned float; it must return a list" in out.infos[1]["error"]


def test_a_batched_reward_that_raises_counts_an_error_for_each_row():
    out = rewards.score_batch(raises, ["a", "b"], ["a", "b"])
    assert out.scores == [0.0, 0.0] and out.num_errors == 2
    assert out.infos[0]["error"] == (
        "batched reward 'raises' raised ConnectionError: judge server down"
    )


def test_a_batched_reward_gets_the_time_of_all_its_rows_and_times_out_for_each():
    start = time.monotonic()
    # Limit 0.1 s x 2 rows = 0.2 s; the reward sleeps 5 s.
    out = rewards.score_batch(sleeps, ["a", "b"], ["a", "b"], timeout_s=0.1)
    assert time.monotonic() - start < 3
    assert out.num_timeouts == 2 and out.num_errors == 0
    assert "ran past its limit of 0.2 s (2 rows)" in out.infos[0]["error"]


def test_one_invalid_item_fails_only_its_row():
    out = rewards.score_batch(one_bad_item, ["a", "b", "c"], ["a", "b", "c"])
    assert out.scores == [1.0, 0.0, 0.5]
    assert out.num_errors == 1 and "non-finite" in out.infos[1]["error"]


def test_registering_with_batched_true_makes_a_reward_batched_by_name():
    REWARDS.add("test_registered_judge", registered_judge, batched=True)
    try:
        assert rewards.is_batched(registered_judge)
        out = rewards.score_batch("test_registered_judge", ["is 4", "is 5"], ["4", "4"])
        assert out.scores == [1.0, 0.0]
    finally:
        REWARDS.unregister("test_registered_judge")


def test_a_batched_reward_in_a_file_of_its_own(tmp_path):
    path = tmp_path / "judge.py"
    path.write_text(
        textwrap.dedent(
            """
            import rewards

            @rewards.batched
            def judge(contexts, **options):
                return [float(len(c.response)) for c in contexts]
            """
        )
    )
    out = rewards.score_batch(f"{path}:judge", ["ab", "abc"], ["", ""])
    assert out.scores == [2.0, 3.0]


def test_the_trainer_scoring_calls_a_batched_reward_once_per_step_with_all_contexts(tmp_path):
    cfg = small_experiment(
        tmp_path,
        tmp_path,
        data={"reward": "tests.test_rewards_batched:judge", "reward_options": {"bonus": 0.25}},
    )
    prompts = PromptSet(
        token_ids=[[1], [1]],
        ground_truths=["5", "7"],
        data_sources=["toy", "toy"],
        messages=[[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]],
        texts=["q0", "q1"],
        extra_infos=[{"k": 0}, {"k": 1}],
    )
    rows = [_row("5", 0), _row("56", 0), _row("789", 1), _row("7", 1)]
    scored = score_rollout(rows, prompts, CharTokenizer(), cfg, groups=[0, 0, 1, 1])
    assert len(CALLS) == 1
    contexts, options = CALLS[0]
    assert options == {"bonus": 0.25}  # DataConfig.reward_options
    assert [c.response for c in contexts] == ["5", "56", "789", "7"]
    assert [c.ground_truth for c in contexts] == ["5", "5", "7", "7"]
    assert [c.prompt for c in contexts] == ["q0", "q0", "q1", "q1"]
    assert [c.extra_info for c in contexts] == [{"k": 0}, {"k": 0}, {"k": 1}, {"k": 1}]
    assert [c.response_length for c in contexts] == [1, 2, 3, 1]
    assert scored.scores == [1.25, 2.25, 3.25, 1.25]  # length + 0.25
    # "long" (> 2 characters) for "789" only: mean 1/4.
    assert scored.metrics["reward/long/mean"] == 0.25


def test_a_batched_reward_cannot_be_a_term_of_a_per_response_reward():
    with pytest.raises(TypeError, match=r"reward 'tests.test_rewards_batched:judge' is batched"):
        rewards.compose("tests.test_rewards_batched:judge")
    with pytest.raises(TypeError, match="'weighted' cannot call it for one response"):
        REWARDS.entry("weighted").extra["check_options"](
            {"terms": [{"reward": "tests.test_rewards_batched:judge"}]}
        )
