"""KL penalties k1/k2/k3/abs and their straight-through ``+`` variants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference import kl_loops as loops
from rlkit.registry import KL_PENALTIES, UnknownNameError

BASE = ["k1", "abs", "k2", "k3"]
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "kl+": "k1+", "mse+": "k2+",
           "low_var_kl+": "k3+"}  # fmt: skip


def penalty(kind, logp, ref):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    value = algorithms.kl_penalty(logp, torch.tensor(ref, dtype=torch.float64), kind)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    return value, grad


@pytest.mark.parametrize(
    "kind, value, grad",
    [
        # log π = −1, log π_ref = −1.5: Δ = 0.5, k = log π_ref − log π = −0.5
        ("k1", 0.5, 1.0),
        ("abs", 0.5, 1.0),
        ("k2", 0.125, 0.5),  # ½Δ², gradient Δ
        ("k3", math.exp(-0.5) + 0.5 - 1, 1 - math.exp(-0.5)),  # e^k − k − 1; d/dlogπ = 1 − e^k
        ("k1+", 0.5, 0.5),  # value of k1, gradient of k2 (Δ)
        ("k3+", math.exp(-0.5) + 0.5 - 1, 0.5),
        ("abs+", 0.5, 0.5),
        ("k2+", 0.125, 0.5),
    ],
)
def test_values_and_gradients_by_hand(kind, value, grad):
    v, g = penalty(kind, [-1.0], [-1.5])
    assert v.item() == pytest.approx(value, rel=1e-12)
    assert g.item() == pytest.approx(grad, rel=1e-12)


def test_k3_clamps_the_exponent_and_the_value():
    # Δ = −30: k = 30 -> clamped to 20 -> e^20 − 21 ≈ 4.85e8 -> clamped to 10, zero gradient.
    v, g = penalty("k3", [-31.0], [-1.0])
    assert v.item() == 10.0 and g.item() == 0.0


finite = st.floats(-50, 50, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=8), st.floats(-1e-6, 1e-6))
def test_k2_and_k3_are_never_negative(pairs, nudge):
    # includes nearly equal log-probs, where e^k − k − 1 cancels catastrophically
    logp = [a for a, _ in pairs] + [a + nudge for a, _ in pairs]
    ref = [b for _, b in pairs] + [a for a, _ in pairs]
    for kind in ("k2", "k3", "mse", "low_var_kl", "k2+", "k3+"):
        value, _ = penalty(kind, logp, ref)
        assert bool((value >= 0).all()), kind


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=6), st.sampled_from(BASE))
def test_plus_variants_have_their_own_value_and_the_gradient_of_k2(pairs, kind):
    logp, ref = [a for a, _ in pairs], [b for _, b in pairs]
    plain, _ = penalty(kind, logp, ref)
    plus, grad = penalty(kind + "+", logp, ref)
    _, k2_grad = penalty("k2", logp, ref)
    assert torch.equal(plus, plain)
    torch.testing.assert_close(grad, k2_grad, rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(finite, finite, st.sampled_from(BASE))
def test_each_kind_matches_the_loop_reference(logp, ref, kind):
    value, _ = penalty(kind, [logp], [ref])
    assert value.item() == pytest.approx(loops.kl(logp, ref, kind), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("alias, canonical", sorted(ALIASES.items()))
def test_aliases_resolve_to_the_same_penalty(alias, canonical):
    assert KL_PENALTIES.get(alias) is KL_PENALTIES.get(canonical)


def test_the_straight_through_gradient_reaches_the_reference_too():
    # d(½(logπ − ref)²)/dref = −Δ = −0.5
    logp = torch.tensor([-1.0], dtype=torch.float64)
    ref = torch.tensor([-1.5], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(algorithms.kl_penalty(logp, ref, "k3+").sum(), ref)
    assert grad.item() == pytest.approx(-0.5)


def test_unknown_kind_gives_the_registry_error():
    x = torch.zeros(1, 2)
    with pytest.raises(UnknownNameError, match="unknown KL penalty 'k4'"):
        algorithms.kl_penalty(x, x, "k4")


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        algorithms.kl_penalty(torch.zeros(2, 3), torch.zeros(2, 4), "k1")
