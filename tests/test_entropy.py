"""Entropy of the policy from logits: value, gradient, degenerate logits."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference import entropy_loops as loops
from rlkit.ops import token_logprobs_and_entropy

INF = math.inf


def entropy_and_grad(rows, dtype=torch.float64):
    logits = torch.tensor(rows, dtype=dtype, requires_grad=True)
    value = algorithms.entropy_from_logits(logits)
    (grad,) = torch.autograd.grad(value.sum(), logits)
    return value, grad


@pytest.mark.parametrize(
    "row, expected",
    [
        ([0.0, 0.0, 0.0, 0.0], math.log(4)),  # uniform over 4
        ([5.0, -INF, -INF], 0.0),  # a single allowed token
        ([0.0, 0.0, -INF], math.log(2)),  # banned token contributes nothing
        ([-INF, -INF, -INF], 0.0),  # nothing allowed: defined as 0
        ([1e30, 1e30, 0.0], math.log(2)),  # huge logits
    ],
)
def test_entropy_by_hand_with_finite_gradients(row, expected):
    value, grad = entropy_and_grad([row])
    assert value.item() == pytest.approx(expected, abs=1e-12)
    assert bool(torch.isfinite(grad).all())


def test_float32_extremes_stay_finite():
    value, grad = entropy_and_grad([[3e38, 3e38, -INF], [-3e38, 0.0, 0.0]], torch.float32)
    torch.testing.assert_close(value, torch.tensor([math.log(2)] * 2))
    assert bool(torch.isfinite(grad).all())


def test_shape_is_the_logits_shape_without_the_vocabulary():
    logits = torch.randn(2, 3, 7)
    assert algorithms.entropy_from_logits(logits).shape == (2, 3)


def test_fused_chunked_entropy_equals_the_plain_reference():
    # The actor's entropy comes from hidden states in chunks, never as (tokens, V) logits;
    # it must equal entropy_from_logits(hidden @ W.T / tau) on the same inputs.
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 5, 8, generator=g), torch.randn(11, 8, generator=g)
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    _, fused = token_logprobs_and_entropy(
        hidden, weight, tokens, temperature=0.7, chunk_size=3, compute_entropy=True
    )
    reference = algorithms.entropy_from_logits((hidden @ weight.T) / 0.7)
    torch.testing.assert_close(fused.float(), reference, rtol=1e-5, atol=1e-5)


logit = st.one_of(st.floats(-30, 30), st.just(-INF))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(logit, min_size=1, max_size=6), min_size=1, max_size=3))
def test_entropy_matches_the_loop_reference(rows):
    width = max(len(r) for r in rows)
    rows = [r + [-INF] * (width - len(r)) for r in rows]
    value, grad = entropy_and_grad(rows)
    expected = torch.tensor([loops.entropy(r) for r in rows], dtype=torch.float64)
    torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12)
    assert bool(torch.isfinite(grad).all())


def test_gradient_matches_autograd_of_the_textbook_formula():
    logits = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    ours = algorithms.entropy_from_logits(logits)
    textbook = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(ours, textbook)
    g1 = torch.autograd.grad(ours.sum(), logits)[0]
    g2 = torch.autograd.grad(textbook.sum(), logits)[0]
    torch.testing.assert_close(g1, g2)


def test_zero_dim_logits_raise():
    with pytest.raises(ValueError, match="vocabulary"):
        algorithms.entropy_from_logits(torch.tensor(1.0))
