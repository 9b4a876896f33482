"""Padding trajectories into a TrainBatch, balancing rows over processes, micro-batch splits."""

import dataclasses
import re

import pytest
import torch

from rlkit.rollout.base import RolloutBatch
from rlkit.rollout.trajectory import NOT_GENERATED, Trajectory, trajectories_from_rollout
from rlkit.trainer.batch import (
    TrainBatch,
    build_batch,
    length_sorted_split,
    pad_rows_to_multiple,
    token_budget_split,
)


def _rollout() -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=[[5, 6], [7]],
        response_ids=[[8, 9, 2], [10]],
        rollout_log_probs=[[-0.1, -0.2, -0.3], [-0.4]],
        finish_reasons=["stop", "length"],
        prompt_index=[0, 1],
    )


def _batch(trajectories=None, response_width=4, scores=(1.0, 0.5)) -> TrainBatch:
    trajectories = trajectories or trajectories_from_rollout(_rollout(), policy_version=3)
    n = len(trajectories)
    return build_batch(
        trajectories,
        pad_token_id=0,
        response_width=response_width,
        index=list(range(n)),
        scores=list(scores)[:n],
        acc=[1.0] * n,
        data_sources=["toy"] * n,
    )


def _tool_trajectory() -> Trajectory:
    # Policy says [8, 9], a tool answers [30, 31] (inserted), the policy ends with [10, 2].
    return Trajectory(
        prompt_ids=[5, 6],
        response_ids=[8, 9, 30, 31, 10, 2],
        loss_mask=[1, 1, 0, 0, 1, 1],
        rollout_log_probs=[-0.1, -0.2, 0.0, 0.0, -0.3, -0.4],
        policy_version=[4, 4, NOT_GENERATED, NOT_GENERATED, 4, 4],
        prompt_index=0,
    )


def test_build_batch_left_pads_prompts_and_right_pads_responses():
    b = _batch()
    # Prompt width P = 2; row 1's prompt [7] is left-padded to [0, 7].
    assert b.prompt_width == 2
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 2, 0], [0, 7, 10, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]]
    # Positions count real tokens only: row 1 starts at position 0 on token 7.
    assert b.position_ids[1].tolist()[1:3] == [0, 1]
    assert b.loss_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert b.rollout_log_prob[0, :3].tolist() == [
        -0.10000000149011612,
        -0.20000000298023224,
        -0.30000001192092896,
    ]
    assert b.response_lengths.tolist() == [3, 1] and b.prompt_lengths.tolist() == [2, 1]
    # Every generated token carries the weights' version; padding -1.
    assert b.policy_version.tolist() == [[3, 3, 3, -1], [3, -1, -1, -1]]
    # The score sits on the last response token: row 0 at t=2 (1.0), row 1 at t=0 (0.5).
    assert b.token_level_scores.tolist() == [[0, 0, 1.0, 0], [0.5, 0, 0, 0]]


def test_inserted_tool_tokens_are_attended_but_not_in_the_loss_mask():
    b = _batch([_tool_trajectory()], response_width=7, scores=[2.0])
    # All 6 response tokens are real (the model reads the tool output) ...
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 1, 0]]
    # ... but only the policy's 4 are trained on.
    assert b.loss_mask.tolist() == [[1, 1, 0, 0, 1, 1, 0]]
    assert b.policy_version.tolist() == [[4, 4, -1, -1, 4, 4, -1]]
    assert b.token_level_scores.tolist() == [[0, 0, 0, 0, 0, 2.0, 0]]


def test_the_score_lands_on_the_last_sampled_token_when_a_tool_turn_ends_the_response():
    traj = dataclasses.replace(
        _tool_trajectory(),
        response_ids=[8, 9, 30, 31],
        loss_mask=[1, 1, 0, 0],
        rollout_log_probs=[-0.1, -0.2, 0.0, 0.0],
        policy_version=[4, 4, -1, -1],
        token_rewards=[0.0, 0.25, 0.0, 0.0],  # a per-turn reward from the environment
    )
    b = _batch([traj], response_width=4, scores=[1.0])
    # Outcome 1.0 added at t=1 (the last token the policy sampled) on top of 0.25.
    assert b.token_level_scores.tolist() == [[0, 1.25, 0, 0]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loss_mask": [1, 1, 0, 0, 1]}, "6 response tokens but 5 entries in loss_mask"),
        ({"loss_mask": [1, 1, 2, 0, 1, 1]}, r"loss_mask\[2\] = 2"),
        ({"rollout_log_probs": [-0.1, -0.2, -0.5, 0.0, -0.3, -0.4]}, "inserted"),
        ({"policy_version": [4, -1, -1, -1, 4, 4]}, "token 1 is generated"),
    ],
)
def test_inconsistent_trajectories_are_refused_naming_the_row(change, message):
    bad = dataclasses.replace(_tool_trajectory(), **change)
    with pytest.raises(ValueError, match=f"trajectory 1: .*{message}"):
        _batch([_tool_trajectory(), bad], response_width=6)


def test_build_batch_rejects_responses_longer_than_width():
    with pytest.raises(ValueError, match="response_width=2"):
        _batch(response_width=2)


def test_padding_rows_have_zero_mask_and_advantages():
    b = _batch()
    b.advantages = torch.ones(2, 4)
    padded = pad_rows_to_multiple(b, 4)
    assert len(padded) == 4
    assert padded.loss_mask[2:].sum() == 0
    assert padded.advantages[2:].sum() == 0
    assert padded.data_sources == ["toy", "toy", None, None]
    assert torch.equal(padded.input_ids[:2], b.input_ids)


def test_select_takes_rows_of_every_layout_in_order():
    b = _batch()
    b.advantages = torch.arange(8.0).reshape(2, 4)
    picked = b.select([1, 0, 1])
    assert picked.input_ids[:, -4:].tolist() == [[10, 0, 0, 0], [8, 9, 2, 0], [10, 0, 0, 0]]
    assert picked.advantages[:, 0].tolist() == [4.0, 0.0, 4.0]
    assert picked.scores.tolist() == [0.5, 1.0, 0.5]
    assert picked.old_log_prob is None  # unset fields stay unset


def test_extras_follow_the_rows_through_select_trim_pad_and_device_moves():
    b = _batch()  # response widths 3 and 1 in a width-4 batch
    b.extras["bonus"] = torch.arange(8.0).reshape(2, 4)  # per token
    b.extras["weight"] = torch.tensor([0.25, 0.75])  # per response
    b.extras["top2"] = torch.arange(16.0).reshape(2, 4, 2)  # per token, a trailing dim
    picked = b.select([1, 0])
    assert picked.extras["bonus"].tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert picked.extras["weight"].tolist() == [0.75, 0.25]
    # Trimming cuts the response columns no row uses (T' = 3) from the token extras only.
    cut = picked.trimmed()
    assert cut.extras["bonus"].tolist() == [[4, 5, 6], [0, 1, 2]]
    assert cut.extras["top2"].shape == (2, 3, 2)
    assert cut.extras["weight"].tolist() == [0.75, 0.25]
    # Balancing rows copy row 0's extras (their loss mask is zero).
    padded = pad_rows_to_multiple(b, 3)
    assert padded.extras["weight"].tolist() == [0.25, 0.75, 0.25]
    assert padded.extras["bonus"].shape == (3, 4)
    assert b.to("cpu").extras.keys() == b.extras.keys()
    # One name reads an extra or a field alike.
    assert b.get("weight") is b.extras["weight"] and b.get("scores") is b.scores
    with pytest.raises(KeyError, match="no tensor 'bonsu'"):
        b.get("bonsu")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.zeros(2, 3), r"shape \(2, 3\); expected \(2, 4\) per token or \(2,\) per response"),
        (torch.zeros(3), r"shape \(3,\)"),
        ([0.0, 1.0], "is a list, not a torch.Tensor"),
    ],
)
def test_an_extra_of_the_wrong_shape_is_named_with_the_shapes_expected(value, message):
    from rlkit.trainer.batch import extra_problem

    assert extra_problem("good", torch.zeros(2, 4), 2, 4) is None
    assert extra_problem("good", torch.zeros(2), 2, 4) is None
    assert re.search(message, extra_problem("bonus", value, 2, 4))


def test_model_inputs_concatenate_the_rows_multimodal_inputs():
    trajs = trajectories_from_rollout(_rollout(), policy_version=0)
    trajs[0].multimodal_inputs = {
        "pixel_values": torch.ones(4, 3),
        "grid": torch.tensor([[1, 2, 2]]),
    }
    trajs[1].multimodal_inputs = {
        "pixel_values": torch.zeros(2, 3),
        "grid": torch.tensor([[1, 1, 2]]),
    }
    inputs = _batch(trajs).select([1, 0]).model_inputs()
    assert inputs["multimodal"]["pixel_values"].shape == (6, 3)  # row 1's 2 patches, then row 0's 4
    assert inputs["multimodal"]["pixel_values"][:2].sum() == 0
    assert inputs["multimodal"]["grid"].tolist() == [[1, 1, 2], [1, 2, 2]]
    assert "multimodal" not in _batch().model_inputs()


def test_token_budget_split_is_a_balanced_permutation_within_budget():
    lengths = torch.tensor([10, 3, 7, 2, 9, 1])
    parts = token_budget_split(lengths, max_tokens=20)
    flat = sorted(torch.cat(parts).tolist())
    assert flat == list(range(6))
    for p in parts:  # padded cost = rows x longest row
        assert len(p) * int(lengths[p].max()) <= 20 or len(p) == 1


def test_token_budget_split_honours_min_parts_with_empty_parts():
    parts = token_budget_split(torch.tensor([4, 4]), max_tokens=100, min_parts=3)
    assert len(parts) == 3
    assert sorted(len(p) for p in parts) == [0, 1, 1]


def test_trimmed_drops_only_columns_that_are_padding_in_every_row():
    b = _batch()
    b.advantages = torch.arange(8.0).reshape(2, 4)
    # Row 1 alone: prompt [7] (1 of P=2 columns), response [10] (1 of T=4 columns).
    t = b.select([1]).trimmed()
    assert t.prompt_width == 1
    assert t.input_ids.tolist() == [[7, 10]]
    assert t.attention_mask.tolist() == [[1, 1]]
    assert t.position_ids.tolist() == [[0, 1]]  # positions of real tokens unchanged
    assert t.responses.tolist() == [[10]] and t.loss_mask.tolist() == [[1.0]]
    assert t.advantages.tolist() == [[4.0]]  # per-token tensors cut to T' = 1
    assert t.policy_version.tolist() == [[3]]
    assert t.prompt_lengths.tolist() == [1]  # per-row tensors untouched
    # Both rows: nothing is padding everywhere except the last response column.
    both = b.trimmed()
    assert both.prompt_width == 2 and both.input_ids.shape == (2, 5)
    assert both.input_ids.tolist() == [[5, 6, 8, 9, 2], [0, 7, 10, 0, 0]]


def test_trimming_keeps_inserted_tokens_inside_a_response():
    b = _batch([_tool_trajectory()], response_width=8, scores=[1.0])
    t = b.trimmed()  # only the two padding columns at the end go
    assert t.loss_mask.tolist() == [[1, 1, 0, 0, 1, 1]]
    assert t.responses.tolist() == [[8, 9, 30, 31, 10, 2]]


def test_length_sorted_split_groups_rows_of_similar_length():
    prompt_lengths = torch.tensor([3, 2, 3, 2, 3, 2])
    response_lengths = torch.tensor([8, 1, 2, 8, 1, 2])
    parts = length_sorted_split(prompt_lengths, response_lengths, micro_batch_size=2)
    # Sorted by (response, prompt): rows 1 (1,2), 4 (1,3), 5 (2,2), 2 (2,3), 3 (8,2), 0 (8,3).
    assert [p.tolist() for p in parts] == [[1, 4], [2, 5], [0, 3]]
    assert length_sorted_split(torch.tensor([]), torch.tensor([]), 4) == []
