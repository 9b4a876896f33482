"""Attention within the segments of one packed row equals one block-diagonal mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.kernels.segmented_attention import (
    AttentionSegments,
    per_segment_attention_reference,
    segmented_attention_reference,
)


def prefix_masks(lengths: list[tuple[int, list[int]]]) -> tuple[list, list]:
    """Segments of a prompt of p tokens followed by responses of the given lengths, each
    response seeing the prompt and its own earlier tokens (the shared-prefix layout)."""
    bounds, masks, start = [], [], 0
    for prompt, responses in lengths:
        seg = torch.tensor([0] * prompt + [i for i, r in enumerate(responses, 1) for _ in range(r)])
        n = len(seg)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        q, k = seg[:, None], seg[None, :]
        masks.append((causal & ((k == 0) | (k == q)))[None, None])
        bounds.append((start, start + n))
        start += n
    return bounds, masks


def test_segments_attend_as_one_block_diagonal_mask_forward_and_backward():
    torch.manual_seed(0)
    # Three segments: 5 + (3, 4), 2 + (6,), 7 + (1, 2, 3): 12 + 8 + 13 = 33 tokens.
    bounds, masks = prefix_masks([(5, [3, 4]), (2, [6]), (7, [1, 2, 3])])
    segments = AttentionSegments(bounds, masks)
    assert segments.length == 33
    # 4 query heads over 2 key/value heads, head dim 8.
    q = torch.randn(1, 4, 33, 8, requires_grad=True)
    k = torch.randn(1, 2, 33, 8, requires_grad=True)
    v = torch.randn(1, 2, 33, 8, requires_grad=True)
    weights = torch.randn(1, 33, 4, 8)

    out = segments.attend(q, k, v)
    (out * weights).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = segmented_attention_reference(segments, q, k, v)
    (ref * weights).sum().backward()

    assert out.shape == (1, 33, 4, 8)
    assert segments.calls == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_batched_call_equals_one_call_per_segment():
    torch.manual_seed(1)
    # Segments of 3 + 5 + 1 = 9, 4 (a prompt alone) and 1 + 2 + 2 + 2 = 7: 20 tokens.
    bounds, masks = prefix_masks([(3, [5, 1]), (4, []), (1, [2, 2, 2])])
    segments = AttentionSegments(bounds, masks)
    q, k, v = torch.randn(1, 2, 20, 4), torch.randn(1, 1, 20, 4), torch.randn(1, 1, 20, 4)
    torch.testing.assert_close(
        segments.attend(q, k, v), per_segment_attention_reference(segments, q, k, v)
    )


def test_a_token_never_sees_another_segment():
    # Two segments of 2 tokens; each token sees only itself and its segment's earlier token.
    bounds, masks = prefix_masks([(1, [1]), (1, [1])])
    segments = AttentionSegments(bounds, masks)
    q = torch.zeros(1, 1, 4, 1)  # equal scores: attention is the mean of the visible values
    k = torch.zeros(1, 1, 4, 1)
    v = torch.tensor([1.0, 3.0, 10.0, 30.0]).reshape(1, 1, 4, 1)
    out = segments.attend(q, k, v).flatten().tolist()
    # token 0: 1; token 1: (1 + 3) / 2 = 2; token 2: 10; token 3: (10 + 30) / 2 = 20.
    assert out == pytest.approx([1.0, 2.0, 10.0, 20.0])


def test_a_mask_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"segment 0 \[0, 3\) has a mask of shape \(1, 1, 2, 2\)"):
        AttentionSegments([(0, 3)], [torch.ones(1, 1, 2, 2, dtype=torch.bool)])


def test_segments_with_a_gap_are_refused():
    masks = [torch.ones(1, 1, 2, 2, dtype=torch.bool)] * 2
    with pytest.raises(ValueError, match="follow one another from token 0 without gaps"):
        AttentionSegments([(0, 2), (3, 5)], masks)


def test_a_row_of_another_length_is_refused():
    bounds, masks = prefix_masks([(2, [2])])
    segments = AttentionSegments(bounds, masks)
    q = torch.zeros(1, 1, 5, 4)
    with pytest.raises(ValueError, match="one packed row of 4 tokens"):
        segments.attend(q, q, q)


def test_causal_rows_take_one_segment_each_and_empty_rows_none():
    segments = AttentionSegments.causal([2, 0, 3])
    assert segments.bounds == [(0, 2), (2, 5)]
    # Row 2's mask: token j sees tokens 0..j.
    assert segments.masks[1][0, 0].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]


def test_a_shared_prompt_is_attended_per_response_over_its_own_and_the_prompts_keys():
    # A prompt of 4, three responses of 60 (184 tokens). Query runs: the prompt with the
    # first response [0, 64) over 64 keys, then each further response's 60 queries over
    # 4 + 60 = 64 keys. Costs, score entries + 12 per gathered entry (rows x (Wq + 2 Wk)):
    # the whole segment 184 x 184 + 12 x (184 + 368) = 33,856 + 6,624 = 40,480; the runs
    # 3 x 64 x 64 + 12 x 3 x (64 + 128) = 12,288 + 6,912 = 19,200; cut to 60 queries
    # ([0, 60) [60, 64) and the two responses) 4 x 60 x 64 + 12 x 4 x 188 = 24,384.
    bounds, masks = prefix_masks([(4, [60, 60, 60])])
    segments = AttentionSegments(bounds, masks)
    assert segments.batch_shape == (3, 64, 64)
    torch.manual_seed(2)
    q = torch.randn(1, 2, 184, 4, requires_grad=True)
    k = torch.randn(1, 1, 184, 4, requires_grad=True)
    v = torch.randn(1, 1, 184, 4, requires_grad=True)
    out = segments.attend(q, k, v)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = per_segment_attention_reference(segments, q, k, v)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_short_segments_stay_one_row_each():
    # Plain causal rows: each is one query run over its own keys, as the whole segment.
    assert AttentionSegments.causal([4, 4]).batch_shape == (2, 4, 4)
    # A prompt of 5, responses of 3, 4 and 2 (14 tokens): the whole segment costs
    # 14 x 14 + 12 x (14 + 28) = 700; its runs [0, 8) [8, 12) [12, 14), over 8, 9 and 7
    # keys, 3 x 8 x 9 + 12 x 3 x (8 + 18) = 1,152: gathering the prompt's keys again per
    # response costs more than the scores it saves.
    bounds, masks = prefix_masks([(5, [3, 4, 2])])
    assert AttentionSegments(bounds, masks).batch_shape == (1, 14, 14)


def test_any_mask_with_its_diagonal_attends_as_its_reference():
    # Random visibility (not causal stretches: queries often lose keys their predecessor
    # saw), so query runs are short; the result must still be the per-segment SDPA's.
    torch.manual_seed(3)
    masks = []
    for n in (6, 9, 1):
        mask = (torch.rand(n, n) < 0.4) | torch.eye(n, dtype=torch.bool)
        masks.append(mask[None, None])
    assert_attends_as_per_segment_reference(AttentionSegments.from_masks(masks), 16)


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.integers(1, 12), st.lists(st.integers(1, 40), min_size=0, max_size=5)),
        min_size=1,
        max_size=3,
    ),
    seed=st.integers(0, 2**16),
)
def test_any_shared_prompt_packing_attends_as_one_call_per_segment(groups, seed):
    # Whatever rows the layout picks (whole segments, runs, runs cut shorter), every token
    # gets the attention its own segment's mask gives it.
    bounds, masks = prefix_masks(groups)
    segments = AttentionSegments(bounds, masks)
    n = segments.length
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, n, 4, generator=gen) for h in (2, 1, 1))
    torch.testing.assert_close(
        segments.attend(q, k, v),
        per_segment_attention_reference(segments, q, k, v),
        rtol=1e-5,
        atol=1e-6,
    )


def test_causal_rows_of_several_lengths_attend_without_a_mask_as_their_reference():
    torch.manual_seed(3)
    # Rows of 5, 1 and 8 tokens: a padded batch of 3 x 8 x 8 under SDPA's own causal
    # flag (no mask built); the 5- and 1-token rows' padding queries are dropped.
    segments = AttentionSegments.causal([5, 1, 8])
    assert segments._causal and segments.batch_shape == (3, 8, 8)
    assert_attends_as_per_segment_reference(segments, 14)
    # A window or a shared prompt is not plain causal: those keep their masks.
    assert not segments.windowed(3)._causal
    bounds, masks = prefix_masks([(2, [3, 2])])
    assert not AttentionSegments(bounds, masks)._causal


def assert_attends_as_per_segment_reference(segments: AttentionSegments, tokens: int) -> None:
    """Outputs and the query's, key's and value's gradients equal one SDPA call per
    segment (4 query heads over 2 key/value heads of 8)."""
    q = torch.randn(1, 4, tokens, 8, requires_grad=True)
    k = torch.randn(1, 2, tokens, 8, requires_grad=True)
    v = torch.randn(1, 2, tokens, 8, requires_grad=True)
    weights = torch.randn(1, tokens, 4, 8)
    (segments.attend(q, k, v) * weights).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (per_segment_attention_reference(segments, q, k, v) * weights).sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        segments.attend(q, k, v), per_segment_attention_reference(segments, q, k, v)
    )
