"""The CPU attention paths of ``rlkit.kernels.attention_math``: one query per row as grouped
matrix products, and float32 compute under bf16 autocast, each against plain SDPA."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.kernels.attention_math import (
    attend,
    cpu_attention,
    sdpa_attention,
    single_query_attention,
)
from tests.numerics import gamma

# A float32 attention output is a softmax-weighted sum over at most 64 keys of 16-wide dot
# products: chains of about 16 + 64 + 64 sums. Two summation orders differ by 2 gamma_D of
# the values' magnitude (about 1 here).
FLOAT32_BOUND = 2 * gamma(16 + 64 + 64)
# bf16 has 8 significant bits (u = 2^-9): the bf16 outputs are rounded once.
BF16_ROUNDING = 2.0**-8


def test_one_query_over_two_keys_by_hand():
    # q = [1, 0], keys [1, 0] and [0, 1], scale 1: scores 1 and 0, weights e/(e+1) and
    # 1/(e+1); values 10 and 20: out = (10 e + 20) / (e + 1).
    q = torch.tensor([[[[1.0, 0.0]]]])
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = torch.tensor([[[[10.0], [20.0]]]])
    out = single_query_attention(q, k, v, None, scale=1.0)
    e = math.e
    assert out.shape == (1, 1, 1, 1)
    assert out.item() == pytest.approx((10 * e + 20) / (e + 1), rel=1e-6)
    # The second key masked out: all weight on the first, out = 10.
    mask = torch.tensor([[[[True, False]]]])
    assert single_query_attention(q, k, v, mask, scale=1.0).item() == pytest.approx(10.0)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_single_query_attention_is_sdpa_on_grouped_heads(kv_heads, mask_kind):
    torch.manual_seed(0)
    rows, heads, keys, dim = 5, 4, 64, 16
    q = torch.randn(rows, heads, 1, dim)
    # Keys and values as the decode cache holds them: views of longer buffers.
    k = torch.randn(rows, kv_heads, keys + 7, dim)[:, :, :keys]
    v = torch.randn(rows, kv_heads, keys + 7, dim)[:, :, :keys]
    mask = None
    if mask_kind != "none":
        visible = torch.rand(rows, 1, 1, keys) > 0.3
        visible[..., -1] = True  # the decoded token always sees itself
        mask = (
            visible
            if mask_kind == "bool"
            else torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
        )
    got = single_query_attention(q, k, v, mask, scale=0.3)
    want = sdpa_attention(q, k, v, mask, scale=0.3)
    assert got.shape == want.shape == (rows, heads, 1, dim)
    assert (got - want).abs().max().item() <= FLOAT32_BOUND * v.abs().max().item()


@pytest.mark.parametrize("queries", [1, 9])
def test_under_bf16_autocast_cpu_attention_computes_in_float32_and_returns_bf16(queries):
    torch.manual_seed(1)
    # As in a bf16 update: q and k come out of the rotary embedding in float32, v from its
    # projection in bf16.
    q = torch.randn(3, 4, queries, 16)
    k = torch.randn(3, 2, 12, 16)
    v = torch.randn(3, 2, 12, 16).to(torch.bfloat16)
    mask = torch.ones(3, 1, queries, 12, dtype=torch.bool).tril(diagonal=12 - queries)
    reference = sdpa_attention(q, k, v.float(), mask)  # float32 throughout, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attend(q, k, v, mask)
        autocast_sdpa = sdpa_attention(q, k, v, mask)  # what autocast alone would compute
    assert got.dtype == autocast_sdpa.dtype == torch.bfloat16
    scale = reference.abs().max().item()
    # Only the output's rounding to bf16 separates it from the float32 reference ...
    assert (got.float() - reference).abs().max().item() <= BF16_ROUNDING * scale
    # ... where SDPA under autocast rounds its inputs too.
    assert (autocast_sdpa.float() - reference).abs().max() >= (got.float() - reference).abs().max()


def test_gradients_through_cpu_attention_under_autocast_are_the_float32_ones():
    torch.manual_seed(2)
    q = torch.randn(2, 4, 6, 16, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, requires_grad=True)
    v = torch.randn(2, 2, 6, 16, requires_grad=True)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    grad_out = torch.randn(2, 4, 6, 16)
    want = torch.autograd.grad(sdpa_attention(q, k, v, mask), (q, k, v), grad_out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cpu_attention(q, k, v, mask)
    got = torch.autograd.grad(out.float(), (q, k, v), grad_out)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        # The incoming gradient reaches the float32 computation through the bf16 output,
        # rounded once to bf16; the backward itself is float32's.
        assert (g - w).abs().max().item() <= BF16_ROUNDING * w.abs().max().item()


def test_an_additive_bf16_mask_is_taken_under_autocast():
    # A float mask in the autocast dtype (as a model may build one) against float32 compute.
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    visible = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cpu_attention(q, k, v, additive.to(torch.bfloat16))
    want = sdpa_attention(q, k, v, visible)
    assert (got.float() - want).abs().max().item() <= BF16_ROUNDING * want.abs().max().item()
