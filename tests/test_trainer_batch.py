"""Padding rollouts into tensors, balancing rows over processes, micro-batch splits."""

import pytest
import torch

from rlkit.rollout.base import RolloutBatch
from rlkit.trainer.batch import (
    build_batch,
    length_sorted_split,
    pad_rows_to_multiple,
    shard_rows,
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


def test_build_batch_left_pads_prompts_and_right_pads_responses():
    b = build_batch(_rollout(), pad_token_id=0, response_width=4)
    # Prompt width P = 2; row 1's prompt [7] is left-padded to [0, 7].
    assert b.prompt_width == 2
    assert b["input_ids"].tolist() == [[5, 6, 8, 9, 2, 0], [0, 7, 10, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]]
    # Positions count real tokens only: row 1 starts at position 0 on token 7.
    assert b["position_ids"][1].tolist()[1:3] == [0, 1]
    assert b["response_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert b["rollout_log_probs"][0, :3].tolist() == [
        -0.10000000149011612,
        -0.20000000298023224,
        -0.30000001192092896,
    ]
    assert b["response_lengths"].tolist() == [3, 1] and b["prompt_lengths"].tolist() == [2, 1]


def test_build_batch_rejects_responses_longer_than_width():
    try:
        build_batch(_rollout(), pad_token_id=0, response_width=2)
    except ValueError as exc:
        assert "response_width=2" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_padding_rows_have_zero_mask_and_advantages():
    b = build_batch(_rollout(), pad_token_id=0, response_width=4)
    b["advantages"] = torch.ones(2, 4)
    padded = pad_rows_to_multiple(b, 4)
    assert len(padded) == 4
    assert padded["response_mask"][2:].sum() == 0
    assert padded["advantages"][2:].sum() == 0
    assert torch.equal(padded["input_ids"][:2], b["input_ids"])


def test_shard_rows_splits_contiguously():
    assert shard_rows(6, 1, 3).tolist() == [2, 3]


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
    b = build_batch(_rollout(), pad_token_id=0, response_width=4)
    b["advantages"] = torch.arange(8.0).reshape(2, 4)
    # Row 1 alone: prompt [7] (1 of P=2 columns), response [10] (1 of T=4 columns).
    t = b.select([1]).trimmed()
    assert t.prompt_width == 1
    assert t["input_ids"].tolist() == [[7, 10]]
    assert t["attention_mask"].tolist() == [[1, 1]]
    assert t["position_ids"].tolist() == [[0, 1]]  # positions of real tokens unchanged
    assert t["responses"].tolist() == [[10]] and t["response_mask"].tolist() == [[1.0]]
    assert t["advantages"].tolist() == [[4.0]]  # per-token tensors cut to T' = 1
    assert t["prompt_lengths"].tolist() == [1]  # per-row tensors untouched
    # Both rows: nothing is padding everywhere except the last response column.
    both = b.trimmed()
    assert both.prompt_width == 2 and both["input_ids"].shape == (2, 5)
    assert both["input_ids"].tolist() == [[5, 6, 8, 9, 2], [0, 7, 10, 0, 0]]


def test_trimmed_refuses_a_2d_tensor_that_is_not_per_response_token():
    b = build_batch(_rollout(), pad_token_id=0, response_width=4)
    b["prompt_only"] = torch.ones(2, 2)  # (B, P): neither (B, T) nor a sequence tensor
    with pytest.raises(ValueError, match=r"'prompt_only' is \(1, 2\).*\(B, T=4\)"):
        b.select([1]).trimmed()


def test_length_sorted_split_groups_rows_of_similar_length():
    prompt_lengths = torch.tensor([3, 2, 3, 2, 3, 2])
    response_lengths = torch.tensor([8, 1, 2, 8, 1, 2])
    parts = length_sorted_split(prompt_lengths, response_lengths, micro_batch_size=2)
    # Sorted by (response, prompt): rows 1 (1,2), 4 (1,3), 5 (2,2), 2 (2,3), 3 (8,2), 0 (8,3).
    assert [p.tolist() for p in parts] == [[1, 4], [2, 5], [0, 3]]
    assert length_sorted_split(torch.tensor([]), torch.tensor([]), 4) == []
