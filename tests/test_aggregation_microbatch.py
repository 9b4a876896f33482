"""Gradient accumulation = one big batch, for every aggregation mode.

Split a mini-batch into k micro-batches of random sizes (fully masked rows
included, each micro-batch cut to its own padded width), compute each
micro-batch's loss with the mini-batch's normalisers (``global_normalizers``)
and sum: value and gradient equal the whole-batch loss's (float64, 1e-12).
This is the peers' most reported bug class (verl #5625, #7321; TRL #2617, #3532).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference.policy_loss_inputs import random_batch
from rlkit.registry import AGGREGATIONS

MODES = AGGREGATIONS.names()
# kl_cov and clip_cov select tokens per micro-batch (as verl does): not split-invariant.
INVARIANT_LOSSES = ["vanilla", "gspo", "cispo", "gpg", "sapo", "geo_mean"]


@st.composite
def split_batches(draw):
    batch = draw(st.integers(1, 8))
    length = draw(st.integers(1, 6))
    cuts = (
        sorted(draw(st.lists(st.integers(1, batch - 1), max_size=3, unique=True)))
        if batch > 1
        else []
    )
    bounds = [0, *cuts, batch]
    b = random_batch(
        draw(st.integers(0, 10_000)),
        batch,
        length,
        spread=draw(st.sampled_from([0.0, 0.3, 1.0])),
        keep=draw(st.sampled_from([0.3, 0.7, 1.0])),
        empty_rows=draw(st.integers(0, 2)),
    )
    slices = [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    return b, slices, draw(st.sampled_from(MODES))


def own_width(mask):
    """The micro-batch's padded width: up to its last valid column (at least 1)."""
    cols = torch.nonzero(mask.any(dim=0)).flatten()
    return int(cols.max()) + 1 if cols.numel() else 1


def micro_batch(b, s):
    width = own_width(b["mask"][s])
    return {k: v[s, :width] for k, v in b.items()}


@settings(max_examples=80, deadline=None)
@given(split_batches())
def test_summed_micro_batch_aggregates_equal_the_whole_batch(case):
    b, slices, mode = case
    loss_mat = (b["new"] * b["adv"] + b["old"]).exp()  # any differentiable (B, T) loss
    norms = algorithms.global_normalizers(b["mask"], slices)
    whole = algorithms.aggregate_loss(loss_mat, b["mask"], mode, **norms)
    parts = sum(
        algorithms.aggregate_loss(
            loss_mat[s, : own_width(b["mask"][s])], b["mask"][s, : own_width(b["mask"][s])], mode,
            **norms,
        )
        for s in slices
    )  # fmt: skip
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)
    (g_whole,) = torch.autograd.grad(whole, b["new"], retain_graph=True)
    (g_parts,) = torch.autograd.grad(parts, b["new"])
    torch.testing.assert_close(g_parts, g_whole, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(split_batches(), st.sampled_from(INVARIANT_LOSSES))
def test_summed_micro_batch_policy_losses_equal_the_whole_batch(case, name):
    b, slices, mode = case
    fn = algorithms.get_loss(name)
    norms = algorithms.global_normalizers([b["mask"][s] for s in slices])
    whole, _ = fn(b["old"], b["new"], b["adv"], b["mask"], loss_agg_mode=mode, **norms)
    parts = 0
    for s in slices:
        m = micro_batch(b, s)
        parts = parts + fn(m["old"], m["new"], m["adv"], m["mask"], loss_agg_mode=mode, **norms)[0]
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)
    (g_whole,) = torch.autograd.grad(whole, b["new"])
    (g_parts,) = torch.autograd.grad(parts, b["new"])
    torch.testing.assert_close(g_parts, g_whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_local_normalisers_would_break_accumulation(mode):
    # The bug this API prevents: per-micro-batch normalisers change the loss.
    # rows (3 tokens, loss 1 each) and (1 token, loss 5): whole token-mean = 8/4 = 2,
    # per-micro-batch token means summed = 1 + 5 = 6.
    loss = torch.tensor([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    whole = algorithms.aggregate_loss(loss, mask, mode)
    local = sum(algorithms.aggregate_loss(loss[i : i + 1], mask[i : i + 1], mode) for i in (0, 1))
    norms = algorithms.global_normalizers(mask)
    glob = sum(
        algorithms.aggregate_loss(loss[i : i + 1], mask[i : i + 1], mode, **norms) for i in (0, 1)
    )
    assert local.item() != pytest.approx(whole.item())
    assert glob.item() == pytest.approx(whole.item(), rel=1e-12)
