"""Padding rollouts into tensors, balancing rows over processes, micro-batch splits."""

import torch

from rlkit.rollout.base import RolloutBatch
from rlkit.trainer.batch import build_batch, pad_rows_to_multiple, shard_rows, token_budget_split


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
