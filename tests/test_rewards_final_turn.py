"""``final_turn``: a correctness reward on the conversation's final answer only."""

from __future__ import annotations

import pytest

import rewards
from rewards.context import RewardContext, fields_read
from rewards.final_turn import final_turn

GSM8K = {"base": "gsm8k", "base_options": {"method": "flexible"}}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*6"}}\n</tool_call>'
USER = {"role": "user", "content": "3 boxes of 6 eggs: how many eggs?"}


def _conversation(*turns):
    return [USER, *turns]


def test_a_single_turn_response_is_scored_whole():
    assert final_turn("3*6 = 18 eggs. #### 18", "18", **GSM8K) == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "18",
        "answered": 1.0,
    }


def test_only_the_last_assistant_turn_counts_not_the_tool_results_before_it():
    conversation = _conversation(
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "18"},
        {"role": "assistant", "content": "So 20 eggs."},
    )
    response = f"{CALL}\n<tool_response>\n18\n</tool_response>\nSo 20 eggs."
    out = final_turn(response, "20", conversation=conversation, **GSM8K)
    assert (out["score"], out["pred"], out["answered"]) == (1.0, "20", 1.0)
    assert final_turn(response, "18", conversation=conversation, **GSM8K)["score"] == 0.0


@pytest.mark.parametrize(
    "last",
    [
        [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "18"}],  # budget
        [{"role": "assistant", "content": "Let me compute. " + CALL}],  # turn limit
    ],
    ids=["ends_in_a_tool_result", "ends_in_a_tool_call"],
)
def test_a_conversation_without_a_final_answer_scores_zero(last):
    # The whole response's last number is the right one (18, or the 6 of the call's
    # expression): a reward on the whole response would pay for no answer.
    conversation = _conversation(*last)
    text = "".join(m["content"] for m in last)
    for reference in ("18", "6"):
        out = final_turn(text, reference, conversation=conversation, **GSM8K)
        assert out == {"score": 0.0, "acc": 0.0, "pred": "", "answered": 0.0}


def test_the_base_options_and_other_fields_reach_the_base_reward():
    strict = final_turn("18", "18", base="gsm8k")  # strict: needs "#### 18"
    assert (strict["score"], strict["answered"]) == (0.0, 1.0)
    assert final_turn("The answer is 18", "18", base="exact_match")["score"] == 0.0
    assert final_turn(" 18 ", "18", base="exact_match")["score"] == 1.0
    with pytest.raises(LookupError):
        final_turn("18", "18", base="no_such_reward")


def test_score_batch_hands_it_the_conversation():
    assert fields_read(final_turn) == ("conversation",)
    conversation = (USER, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "18"})
    contexts = [
        RewardContext(response="#### 18", ground_truth="18"),  # single turn
        RewardContext(response=CALL + "18", ground_truth="18", conversation=conversation),
    ]
    result = rewards.score_batch(
        "final_turn",
        [c.response for c in contexts],
        ["18", "18"],
        [{**GSM8K, "data_source": "gsm8k", "response_length": 1}] * 2,
        contexts=contexts,
    )
    assert result.num_errors == 0, result.infos
    assert result.scores == [1.0, 0.0]
    assert [info["answered"] for info in result.infos] == [1.0, 0.0]
