"""The chunked matmul scan and the valid-token packing behind GAE and discounted returns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators.discounted_scan import (
    chunk_size,
    masked_reverse_discounted_cumsum,
    reverse_discounted_cumsum,
)
from estimators.valid_token_compaction import is_prefix_mask, plan_packing


def loop_scan(x, decay, mask=None):
    """y_t = x_t + decay * y_{t'} over valid tokens, one step at a time."""
    mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    out = torch.zeros_like(x)
    carry = torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        carry = torch.where(mask[:, t], x[:, t] + decay * carry, carry)
        out[:, t] = torch.where(mask[:, t], carry, 0.0)
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    length=st.integers(1, 300),
    decay=st.sampled_from([0.0, 0.3, 0.9, 0.999, 1.0]),
)
def test_chunked_scan_matches_the_step_loop(seed, batch, length, decay):
    x = torch.randn(
        batch, length, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    torch.testing.assert_close(reverse_discounted_cumsum(x, decay), loop_scan(x, decay))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    length=st.integers(1, 120),
    keep=st.floats(0, 1),
    decay=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
)
def test_masked_scan_skips_mask_zero_tokens_counting_valid_steps_only(
    seed, batch, length, keep, decay
):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, length, generator=gen) < keep
    mask_f = mask.to(x.dtype)
    ours = masked_reverse_discounted_cumsum(x, mask, mask_f, decay)
    torch.testing.assert_close(ours, loop_scan(x, decay, mask))


def test_scan_of_4096_steps_in_float32_is_accurate_and_finite():
    # d^4096 = 0.9^4096 ~ 1e-188 underflows; no negative powers are ever formed.
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(0))
    for decay in (0.9, 0.99, 1.0):
        ours = reverse_discounted_cumsum(x, decay)
        expected = loop_scan(x.double(), decay)
        assert torch.isfinite(ours).all()
        assert ((ours.double() - expected).abs().max() / expected.abs().max()).item() < 1e-5


def test_single_step_decay_example():
    # x = [1, 2, 3], d = 0.5: y_2 = 3; y_1 = 2 + 1.5 = 3.5; y_0 = 1 + 1.75 = 2.75.
    x = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(reverse_discounted_cumsum(x, 0.5), torch.tensor([[2.75, 3.5, 3.0]]))


@pytest.mark.parametrize(
    ("length", "chunk"), [(1, 1), (16, 16), (4096, 32), (32768, 32), (65536, 64)]
)
def test_chunk_size_keeps_the_carry_matrix_small(length, chunk):
    assert chunk_size(length) == chunk


def test_prefix_masks_are_recognised_and_pack_as_identity():
    right_padded = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    interior = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    left_padded = torch.tensor([[0, 1, 1]], dtype=torch.bool)
    assert is_prefix_mask(right_padded.double())
    assert not is_prefix_mask(interior.double()) and not is_prefix_mask(left_padded.double())
    assert plan_packing(right_padded, right_padded.float()).is_identity


def test_packing_moves_valid_tokens_to_the_front_and_back():
    # Valid tokens 0, 2, 3 -> slots 0, 1, 2; slot 3 stays 0.
    mask = torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)
    packing = plan_packing(mask, mask.float())
    x = torch.tensor([[10.0, 0.0, 30.0, 40.0]])
    packed = packing.pack(x)
    assert packed.tolist() == [[10.0, 30.0, 40.0, 0.0]]
    assert packing.unpack(packed).tolist() == [[10.0, 0.0, 30.0, 40.0]]
