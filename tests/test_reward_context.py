"""Rewards read the context fields their signature names, and only those."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import rewards
from rewards.context import RewardContext, context_kwargs, fields_read
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import score_rollout
from tests.experiment_factory import small_experiment


def legacy(response, ground_truth, **extra):
    """A reward written before contexts existed: it reports the keywords it got."""
    return {"score": 1.0, "keys": ",".join(sorted(extra))}


def reads_extra_info(response, ground_truth, *, extra_info, **extra):
    return float(extra_info["bonus"])


def reads_prompt_and_messages(response, ground_truth, prompt, messages=None, **extra):
    return {"score": float(prompt.endswith("=")), "turns": float(len(messages))}


def reads_the_whole_context(response, ground_truth, *, context, **extra):
    return float(context.response_length)


CONTEXT = RewardContext(
    response=" 5",
    ground_truth="5",
    prompt="2+3=",
    messages=({"role": "user", "content": "2+3="},),
    data_source="toy",
    extra_info={"bonus": 0.25},
    response_length=2,
)


def test_a_reward_declares_what_it_reads_by_naming_parameters():
    assert fields_read(legacy) == ()  # **extra is no declaration
    assert fields_read(reads_extra_info) == ("extra_info",)
    assert fields_read(reads_prompt_and_messages) == ("prompt", "messages")
    assert fields_read(reads_the_whole_context) == ("context",)
    assert context_kwargs(fields_read(reads_prompt_and_messages), CONTEXT) == {
        "prompt": "2+3=",
        "messages": [{"role": "user", "content": "2+3="}],
    }


@pytest.mark.parametrize("num_workers", [0, 1])
def test_score_batch_hands_each_reward_its_declared_fields(num_workers):
    extras = [{"data_source": "toy", "response_length": 2}]
    calls = {
        legacy: {"score": 1.0, "keys": "data_source,response_length"},  # unchanged call
        reads_extra_info: {"score": 0.25},
        reads_prompt_and_messages: {"score": 1.0, "turns": 1.0},
        reads_the_whole_context: {"score": 2.0},
    }
    for fn, expected in calls.items():
        result = rewards.score_batch(
            fn, [" 5"], ["5"], extras, contexts=[CONTEXT], num_workers=num_workers
        )
        assert result.num_errors == 0, result.infos
        assert {"score": result.scores[0], **result.infos[0]} == expected, fn.__name__


def test_score_batch_rejects_a_context_count_that_does_not_match():
    with pytest.raises(ValueError, match="2 contexts for 1 responses"):
        rewards.score_batch(legacy, ["a"], ["a"], contexts=[CONTEXT, CONTEXT])


def test_the_trainer_scoring_passes_each_row_its_prompts_extra_info(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_experiment(
        tiny_model_dir, tmp_path, data={"reward": "tests.test_reward_context:reads_extra_info"}
    )
    prompts = PromptSet(
        token_ids=[[5], [6]],
        ground_truths=["1", "2"],
        data_sources=["toy", "toy"],
        messages=[[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
        texts=["a", "b"],
        extra_infos=[{"bonus": 0.5}, {"bonus": 2.0}],
    )

    def row(prompt_index: int) -> Trajectory:
        return Trajectory([5 + prompt_index], [40], [1], [-0.5], [0], prompt_index)

    scored = score_rollout([row(1), row(0), row(1)], prompts, tok, cfg, groups=[0, 1, 2])
    # Each row's score is its own prompt's bonus: prompts 1, 0, 1.
    assert scored.scores == [2.0, 0.5, 2.0]
    assert scored.metrics.get("reward/num_errors", 0) == 0
