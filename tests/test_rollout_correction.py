"""Rollout importance-sampling correction: TIS truncation and IcePop masking."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference import rollout_correction_loops as loops
from algorithms.reference.policy_loss_inputs import random_batch
from rlkit.registry import ROLLOUT_CORRECTIONS, UnknownNameError

LN = math.log


def batch(log_w, mask=None):
    """rollout log-prob 0, old log-prob = log w (so the weight is w); one (B, T) batch."""
    old = torch.tensor(log_w, dtype=torch.float64)
    mask = torch.ones_like(old, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return old, torch.zeros_like(old), mask


def test_token_truncation_by_hand():
    # w = (3, 0.5, 1, pad): min(w, 2) = (2, 0.5, 1, 0); one of three valid tokens truncated.
    old, rollout, mask = batch([[LN(3), LN(0.5), 0.0, 7.0]], [[True, True, True, False]])
    w, metrics = algorithms.rollout_is_weights(old, rollout, mask, mode="truncate", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0, 0.0]], dtype=torch.float64))
    assert metrics["rollout_is/clip_frac"].item() == pytest.approx(1 / 3)
    assert metrics["rollout_is/max"].item() == pytest.approx(3.0)
    assert metrics["rollout_is/mean"].item() == pytest.approx(3.5 / 3)
    # mismatch KL(π_rollout ‖ π_old): k1 = mean(−log w) = −(ln 3 + ln 0.5)/3,
    # k3 = mean(w − 1 − log w) = ((2 − ln 3) + (−0.5 + ln 2) + 0)/3
    assert metrics["rollout_is/mismatch_kl_k1"].item() == pytest.approx(-(LN(3) + LN(0.5)) / 3)
    k3 = ((2 - LN(3)) + (-0.5 + LN(2))) / 3
    assert metrics["rollout_is/mismatch_kl"].item() == pytest.approx(k3)


def test_truncation_with_a_lower_bound():
    # clamp(w, 0.8, 2): (3, 0.5, 1) -> (2, 0.8, 1); two tokens affected
    old, rollout, mask = batch([[LN(3), LN(0.5), 0.0]])
    w, metrics = algorithms.rollout_is_weights(old, rollout, mask, threshold=2.0, threshold_low=0.8)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.8, 1.0]], dtype=torch.float64))
    assert metrics["rollout_is/clip_frac"].item() == pytest.approx(2 / 3)


def test_icepop_masks_tokens_outside_the_band():
    # band [1/2, 2] (default lower bound 1/threshold): w = (3, 0.5, 1, 0.4) -> (0, 0.5, 1, 0)
    old, rollout, mask = batch([[LN(3), LN(0.5), 0.0, LN(0.4)]])
    w, metrics = algorithms.rollout_is_weights(old, rollout, mask, mode="mask", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 1.0, 0.0]], dtype=torch.float64))
    assert metrics["rollout_is/mask_frac"].item() == pytest.approx(0.5)


def test_sequence_level_uses_the_product_of_token_ratios():
    # row 0: 3 · 0.5 · 1 = 1.5 on every valid token; row 1: 3 · 3 = 9 -> truncated to 2 / masked.
    old, rollout, mask = batch([[LN(3), LN(0.5), 0.0], [LN(3), LN(3), 5.0]],
                               [[True] * 3, [True, True, False]])  # fmt: skip
    w, _ = algorithms.rollout_is_weights(old, rollout, mask, level="sequence", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5] * 3, [2.0, 2.0, 0.0]], dtype=torch.float64))
    w, m = algorithms.rollout_is_weights(old, rollout, mask, level="sequence", mode="mask")
    torch.testing.assert_close(w, torch.tensor([[1.5] * 3, [0.0] * 3], dtype=torch.float64))
    assert m["rollout_is/mask_frac"].item() == pytest.approx(2 / 5)


def test_long_sequences_do_not_overflow():
    # 2000 tokens with log w = 1 each: Σ = 2000 -> clamped to 20 before exp.
    old = torch.ones(2, 2000, dtype=torch.float32)
    rollout = torch.zeros_like(old)
    mask = torch.ones_like(old, dtype=torch.bool)
    for mode in ("truncate", "mask"):
        w, metrics = algorithms.rollout_is_weights(old, rollout, mask, level="sequence", mode=mode)
        assert bool(torch.isfinite(w).all())
        assert all(bool(torch.isfinite(v)) for v in metrics.values())
    assert metrics["rollout_is/max"].item() == pytest.approx(math.exp(20), rel=1e-6)


def test_weights_are_detached_and_zero_at_padding():
    b = random_batch(0, 3, 4, empty_rows=1)
    rollout = b["old"] + 0.1
    w, _ = algorithms.rollout_is_weights(b["new"], rollout, b["mask"])
    assert not w.requires_grad
    assert bool((w[~b["mask"]] == 0).all())


case = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "batch": st.integers(0, 4),
        "length": st.integers(1, 6),
        "level": st.sampled_from(["token", "sequence"]),
        "mode": st.sampled_from(["truncate", "mask", "tis", "icepop"]),
        "threshold": st.sampled_from([1.2, 2.0, 5.0]),
        "low": st.sampled_from([None, 0.5]),
    }
)


@settings(max_examples=60, deadline=None)
@given(case)
def test_weights_match_the_loop_reference(c):
    b = random_batch(c["seed"], c["batch"], c["length"], spread=0.5, empty_rows=1)
    rollout = b["old"] + 0.4 * torch.randn(b["old"].shape, dtype=torch.float64)
    w, metrics = algorithms.rollout_is_weights(
        b["old"], rollout, b["mask"], level=c["level"], mode=c["mode"],
        threshold=c["threshold"], threshold_low=c["low"],
    )  # fmt: skip
    mode = {"tis": "truncate", "icepop": "mask"}.get(c["mode"], c["mode"])
    expected = loops.rollout_weights(
        b["old"], rollout, b["mask"], level=c["level"], mode=mode, hi=c["threshold"], lo=c["low"]
    )
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64).view_as(w))
    assert metrics["rollout_is/mismatch_kl"].item() >= 0


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"level": "geometric"}, "unknown level"),
        ({"threshold": 0.0}, "threshold must be"),
        ({"threshold": 2.0, "threshold_low": 3.0}, "threshold_low"),
        ({"mode": "mask", "threshold": 0.5}, "threshold >= 1"),
    ],
)
def test_bad_settings_raise(kwargs, fragment):
    old, rollout, mask = batch([[0.1, 0.2]])
    with pytest.raises(ValueError, match=fragment):
        algorithms.rollout_is_weights(old, rollout, mask, **kwargs)


def test_modes_are_registered_with_aliases_and_unknown_modes_fail_clearly():
    assert ROLLOUT_CORRECTIONS.get("tis") is ROLLOUT_CORRECTIONS.get("truncate")
    assert ROLLOUT_CORRECTIONS.get("icepop") is ROLLOUT_CORRECTIONS.get("mask")
    old, rollout, mask = batch([[0.1]])
    with pytest.raises(UnknownNameError, match="unknown rollout correction 'clip'"):
        algorithms.rollout_is_weights(old, rollout, mask, mode="clip")


def test_weights_feed_a_policy_loss():
    # r = 1, A = 1 on two tokens: vanilla's per-token loss is −1; weights (2, 0.5)
    # after truncation at 2 of w = (e, 0.5): token-sum = −2 − 0.5 = −2.5
    old, rollout, mask = batch([[1.0, LN(0.5)]])
    w, _ = algorithms.rollout_is_weights(old, rollout, mask, threshold=2.0)
    new = old.clone().requires_grad_()
    loss, _ = algorithms.get_loss("vanilla")(
        old, new, torch.ones_like(old), mask, rollout_is_weights=w, loss_agg_mode="token-sum"
    )
    assert loss.item() == pytest.approx(-2.5)
