"""``vanilla``: PPO clip, decoupled clip-higher, dual-clip (hand-computed and properties)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference.policy_loss_inputs import random_batch

vanilla = algorithms.get_loss("vanilla")
PAD = -math.inf  # garbage a model could leave at padded positions


def one_row(ratios, advantages, *, pad=0):
    """A (1, T) batch with log π_old = 0 and log π = log r, plus ``pad`` padded tokens."""
    old = torch.zeros(1, len(ratios) + pad, dtype=torch.float64)
    new = torch.tensor([[math.log(r) for r in ratios] + [PAD] * pad], dtype=torch.float64)
    adv = torch.tensor([list(advantages) + [0.0] * pad], dtype=torch.float64)
    mask = torch.tensor([[True] * len(ratios) + [False] * pad])
    old[0, len(ratios) :] = PAD
    return old, new.requires_grad_(), adv, mask


def test_hand_computed_row_with_every_case():
    # ε = 0.2 (band [0.8, 1.2]), c = 3, token-sum:
    #  r=1.1, A=1 : inside the band        L = −1.1          dL/dlogπ = −A·r = −1.1
    #  r=1.5, A=1 : above 1.2, A > 0       L = max(−1.5, −1.2) = −1.2   grad 0, clipped
    #  r=0.5, A=−1: below 0.8, A < 0       L = max(0.5, 0.8)  = 0.8     grad 0, clipped
    #  r=4,   A=−1: above c = 3            L = min(max(4, 1.2), 3) = 3  grad 0, dual clip
    #  r=2,   A=−2: below c                L = min(max(4, 2.4), 6) = 4  grad = −A·r = 4
    # total = −1.1 − 1.2 + 0.8 + 3 + 4 = 5.5; the padded token (log-probs −inf) is ignored.
    old, new, adv, mask = one_row([1.1, 1.5, 0.5, 4.0, 2.0], [1, 1, -1, -1, -2], pad=1)
    loss, metrics = vanilla(old, new, adv, mask, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(5.5, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, new)
    expected = torch.tensor([[-1.1, 0.0, 0.0, 0.0, 4.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    # clipped: tokens 2 and 3 of 5; dual clip: token 4 of 5; ppo_kl = mean(−log r).
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    kl = -(math.log(1.1) + math.log(1.5) + math.log(0.5) + math.log(4) + math.log(2)) / 5
    assert metrics["ppo_kl"].item() == pytest.approx(kl, rel=1e-12)
    # token-mean over the 5 valid tokens: 5.5 / 5 = 1.1
    mean, _ = vanilla(old, new, adv, mask)
    assert mean.item() == pytest.approx(1.1, rel=1e-12)


ratio_inside = st.floats(0.81, 1.19)
advantage = st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3)


@settings(max_examples=60, deadline=None)
@given(ratio_inside, advantage)
def test_inside_the_band_loss_is_minus_a_r_with_gradient_minus_a_r(r, a):
    old, new, adv, mask = one_row([r], [a])
    loss, metrics = vanilla(old, new, adv, mask)
    assert loss.item() == pytest.approx(-a * r, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, new)
    assert grad.item() == pytest.approx(-a * r, rel=1e-9)  # d(−A·e^logπ)/dlogπ
    assert metrics["pg_clipfrac"].item() == 0.0


@settings(max_examples=60, deadline=None)
@given(st.floats(1.21, 2.9), st.floats(0.05, 0.79), st.floats(0.01, 5))
def test_gradient_is_zero_where_the_clip_binds(r_high, r_low, a):
    # A > 0 with r > 1 + ε and A < 0 with r < 1 − ε: the clipped term is the max.
    old, new, adv, mask = one_row([r_high, r_low], [a, -a])
    loss, metrics = vanilla(old, new, adv, mask, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(-a * 1.2 + a * 0.8, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, new)
    assert grad.abs().max().item() == 0.0
    assert metrics["pg_clipfrac"].item() == 1.0


@settings(max_examples=60, deadline=None)
@given(st.floats(3.01, 50), st.floats(0.01, 5))
def test_dual_clip_binds_only_for_negative_advantages(r, a):
    # A < 0, r > c = 3: capped at −A·c (zero gradient). A > 0: c changes nothing.
    old, new, adv, mask = one_row([r], [-a])
    loss, metrics = vanilla(old, new, adv, mask, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(3.0 * a, rel=1e-12)
    assert torch.autograd.grad(loss, new)[0].item() == 0.0
    assert metrics["pg_clipfrac_lower"].item() == 1.0
    old, new, adv, mask = one_row([r], [a])
    tight, m_tight = vanilla(old, new, adv, mask, clip_ratio_c=1.01)
    loose, _ = vanilla(old, new, adv, mask, clip_ratio_c=100.0)
    assert tight.item() == loose.item() == pytest.approx(-a * 1.2, rel=1e-12)
    assert m_tight["pg_clipfrac_lower"].item() == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.1, 0.2, 0.3]))
def test_clip_higher_with_equal_bounds_equals_symmetric_clip(seed, eps):
    b = random_batch(seed, 4, 6, spread=0.6)
    args = (b["old"], b["new"], b["adv"], b["mask"])
    symmetric, m1 = vanilla(*args, clip_ratio=eps)
    decoupled, m2 = vanilla(*args, clip_ratio=0.9, clip_ratio_low=eps, clip_ratio_high=eps)
    assert symmetric.item() == decoupled.item()
    assert {k: v.item() for k, v in m1.items()} == {k: v.item() for k, v in m2.items()}


def test_clip_higher_raises_only_the_upper_bound():
    # r = 1.25, A = 1: ε_high = 0.28 keeps it inside (L = −1.25); ε = 0.2 clips (L = −1.2).
    old, new, adv, mask = one_row([1.25], [1.0])
    assert vanilla(old, new, adv, mask)[0].item() == pytest.approx(-1.2)
    assert vanilla(old, new, adv, mask, clip_ratio_high=0.28)[0].item() == pytest.approx(-1.25)
    # r = 0.75, A = −1: the lower bound 1 − ε_low = 0.8 still binds (L = 0.8).
    old, new, adv, mask = one_row([0.75], [-1.0])
    assert vanilla(old, new, adv, mask, clip_ratio_high=0.28)[0].item() == pytest.approx(0.8)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_constant_must_exceed_one(c):
    old, new, adv, mask = one_row([1.0], [1.0])
    with pytest.raises(ValueError, match="clip_ratio_c"):
        vanilla(old, new, adv, mask, clip_ratio_c=c)


def test_rollout_is_weights_multiply_the_per_token_loss():
    # r = 1 everywhere, A = (1, 2): L = (−1, −2); weights (0.5, 3) -> −0.5 − 6 = −6.5.
    old, new, adv, mask = one_row([1.0, 1.0], [1.0, 2.0])
    weights = torch.tensor([[0.5, 3.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = vanilla(old, new, adv, mask, loss_agg_mode="token-sum", rollout_is_weights=weights)
    assert loss.item() == pytest.approx(-6.5)
    grad, weights_grad = torch.autograd.grad(loss, [new, weights], allow_unused=True)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -6.0]], dtype=torch.float64))
    assert weights_grad is None  # the weights are treated as data (detached)
