"""Attention variants of the supported families in rlkit's own attention paths: sliding
windows in segments, soft-capped scores, value heads of another size than the keys'
(multi-head latent attention), each against a plain computation or a hand count."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.kernels.attention_math import attend, softcapped_attention
from rlkit.kernels.segmented_attention import AttentionSegments, segmented_attention_reference
from rlkit.kernels.shared_prefix_decode import (
    SharedPrefix,
    reference_shared_prefix_attention,
    shared_prefix_attention,
)
from rlkit.rollout.embedded.kv_cache import InPlaceLayer
from tests.test_kernels_segmented_attention import prefix_masks


def test_a_capped_score_is_c_tanh_of_the_score_over_c_by_hand():
    # One query, two keys, one head of dim 1, scale 1: scores 3 and 0, cap 1.
    # Capped: tanh(3) = 0.99505 and 0 -> weights e^0.99505 : 1 = 2.7049 : 1.
    # Values 1 and 0: out = 2.7049 / 3.7049 = 0.73009 (uncapped: e^3 / (e^3 + 1) = 0.95257).
    q = torch.ones(1, 1, 1, 1)
    k = torch.tensor([3.0, 0.0]).reshape(1, 1, 2, 1)
    v = torch.tensor([1.0, 0.0]).reshape(1, 1, 2, 1)
    out = attend(q, k, v, None, scale=1.0, softcap=1.0)
    expected = math.exp(math.tanh(3.0)) / (math.exp(math.tanh(3.0)) + 1)
    assert out.item() == pytest.approx(expected, rel=1e-6)
    assert attend(q, k, v, None, scale=1.0).item() == pytest.approx(math.exp(3) / (math.exp(3) + 1))


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive"])
def test_softcapped_attention_with_a_huge_cap_is_sdpa(mask_kind):
    # c * tanh(s / c) = s - s^3 / (3 c^2) + ...: with c = 1e4 and |s| < 10 the change is
    # below 1e-6 relative, float32 rounding.
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6)
    mask = {
        "none": None,
        "causal": None,
        "bool": torch.rand(2, 1, 5, 5) > 0.3,
        "additive": torch.randn(2, 1, 5, 5),
    }[mask_kind]
    if mask is not None and mask.dtype == torch.bool:
        mask[..., 0] = True  # every query sees a key
    causal = mask_kind == "causal"
    got = softcapped_attention(
        q, k, v, mask, scale=None, dropout=0.0, softcap=1e4, is_causal=causal
    )
    want = attend(q, k, v, mask, is_causal=causal)
    assert got.shape == (2, 4, 5, 6)  # value head size 6 != key head size 8
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _windowed_reference(segments: AttentionSegments, window: int, q, k, v, softcap=None):
    """One (N x N) mask over the whole row: the segments' masks narrowed to the window."""
    n = segments.length
    full = torch.zeros(1, 1, n, n, dtype=torch.bool)
    for (start, end), mask in zip(segments.bounds, segments.masks):
        pos = segments.positions[start:end]
        full[..., start:end, start:end] = mask & ((pos[:, None] - pos[None, :]) < window)
    return attend(q, k, v, full, softcap=softcap).transpose(1, 2)


def test_a_window_keeps_the_keys_fewer_than_w_positions_back_by_hand():
    # One segment: prompt of 2 (positions 0, 1), then responses of 2 and 2 (positions 2, 3
    # each). Window 2: a query sees itself and the key one position before it, if visible.
    bounds, masks = prefix_masks([(2, [2, 2])])
    segments = AttentionSegments(bounds, masks, positions=torch.tensor([0, 1, 2, 3, 2, 3]))
    allowed = segments.windowed(2).masks[0][0, 0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],  # response 1, position 2: the prompt's position 1 and itself
        [0, 0, 1, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],  # response 2, position 2: the prompt's position 1, not response 1
        [0, 0, 0, 0, 1, 1],
    ]
    assert segments.windowed(6) is segments  # nothing that far back: the same layout


@settings(max_examples=25, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.integers(1, 6), st.lists(st.integers(1, 5), max_size=3)),
        min_size=1,
        max_size=3,
    ),
    window=st.integers(1, 8),
    softcap=st.sampled_from([None, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_any_windowed_soft_capped_packing_attends_as_its_full_mask(groups, window, softcap, seed):
    bounds, masks = prefix_masks(groups)
    positions = torch.cat(
        [torch.cat([torch.arange(p), *(torch.arange(p, p + r) for r in rs)]) for p, rs in groups]
    )
    segments = AttentionSegments(bounds, masks, positions=positions)
    gen = torch.Generator().manual_seed(seed)
    n = segments.length
    q = torch.randn(1, 4, n, 8, generator=gen) * 3  # scores of several units: caps bite
    k, v = torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 5, generator=gen)
    got = segments.attend(q, k, v, window=window, softcap=softcap)
    want = _windowed_reference(segments, window, q, k, v, softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if window >= n and softcap is None:  # no window bites: the plain reference
        torch.testing.assert_close(got, segmented_attention_reference(segments, q, k, v))


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_shared_prefix_decode_attention_takes_caps_and_other_value_sizes(softcap):
    torch.manual_seed(0)
    groups, n, prompt, own = 2, 3, 6, 4
    prefix = SharedPrefix(torch.randn(groups, 2, prompt, 8), torch.randn(groups, 2, prompt, 5), n)
    query = torch.randn(groups * n, 4, 1, 8) * 3
    keys, values = torch.randn(groups * n, 2, own, 8), torch.randn(groups * n, 2, own, 5)
    got = shared_prefix_attention(query, prefix, keys, values, None, None, softcap)
    want = reference_shared_prefix_attention(query, prefix, keys, values, None, None, softcap)
    assert got.shape == (groups * n, 1, 4, 5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_in_place_cache_holds_keys_and_values_of_different_sizes():
    # Multi-head latent attention caches a latent (16 wide) beside a rotary key (8 wide).
    layer = InPlaceLayer(capacity=8)
    k1, v1 = torch.randn(2, 1, 3, 16), torch.randn(2, 1, 3, 8)
    keys, values = layer.update(k1, v1)
    k2, v2 = torch.randn(2, 1, 1, 16), torch.randn(2, 1, 1, 8)
    keys, values = layer.update(k2, v2)
    torch.testing.assert_close(keys, torch.cat([k1, k2], dim=2))
    torch.testing.assert_close(values, torch.cat([v1, v2], dim=2))
    layer.batch_repeat_interleave(2)
    layer.batch_select_indices(torch.tensor([0, 3]))
    assert layer.keys.shape == (2, 1, 4, 16) and layer.values.shape == (2, 1, 4, 8)
    torch.testing.assert_close(layer.values[1], torch.cat([v1, v2], dim=2)[1])
