"""Properties of the estimators beyond rlkit.testing's battery, on random batches with hypothesis.

The battery (``tests/test_testing_kit.py``) checks every registered estimator for
row permutation, group relabelling, masked inputs, degenerate groups and the
optional properties each one declares (group zero-sum, per-group and common
shift invariance, scale invariance by powers of two, group locality). Kept here:
scale invariance at arbitrary scales, padding at 1e-12, and hand-derived
formulas (RLOO's leave-one-out mean, GAE's special cases).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import estimators
from estimators.reference.estimator_loops import random_inputs
from rlkit.testing import declared_inputs

ALL = estimators.names()
KW = {"gamma": 0.9, "lam": 0.8}

seeds = st.integers(0, 2**31 - 1)
groups = st.lists(st.integers(2, 5), min_size=1, max_size=5)
lengths = st.integers(1, 10)
masks = st.sampled_from(["right_padded", "contiguous", "holes"])


def row_scalars(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-row value of an outcome advantage (constant over a row's valid tokens)."""
    return (advantages * mask).sum(-1) / mask.sum(-1)


@pytest.mark.parametrize("name", ["grpo", "grpo_batch_std", "grpo_passk"])
@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    sizes=groups,
    length=lengths,
    scale=st.floats(1e-3, 1e3),
    reward_kind=st.sampled_from(["dense", "outcome"]),
)
def test_std_normalised_advantages_are_invariant_to_positive_scaling(
    name, seed, sizes, length, scale, reward_kind
):
    # With epsilon = 0 the std division cancels any positive scale exactly
    # (zero-std groups give 0 at every scale).
    inputs = random_inputs(seed, sizes, length, reward_kind=reward_kind)
    scaled = {**inputs, "token_level_rewards": inputs["token_level_rewards"] * scale}
    before = estimators.get(name)(**inputs, epsilon=0.0)[0]
    after = estimators.get(name)(**scaled, epsilon=0.0)[0]
    torch.testing.assert_close(after, before, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, sizes=groups, length=lengths, mask_kind=masks)
def test_rloo_is_score_minus_mean_of_the_other_responses(seed, sizes, length, mask_kind):
    inputs = random_inputs(seed, sizes, length, mask_kind=mask_kind)
    scores = inputs["token_level_rewards"].sum(-1)
    ids = inputs["index"]
    expected = torch.stack(
        [
            scores[i] - scores[(ids == ids[i]) & (torch.arange(len(ids)) != i)].mean()
            for i in range(len(ids))
        ]
    )
    per_row = row_scalars(estimators.get("rloo")(**inputs)[0], inputs["response_mask"])
    torch.testing.assert_close(per_row, expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, batch=st.integers(1, 5), length=st.integers(1, 70), mask_kind=masks)
def test_gae_with_unit_discounts_and_zero_values_is_reverse_cumulative_reward(
    seed, batch, length, mask_kind
):
    inputs = random_inputs(seed, [batch], length, mask_kind=mask_kind)
    mask = inputs["response_mask"]
    zero_values = {**inputs, "values": torch.zeros_like(inputs["values"])}
    advantages, returns = estimators.get("gae")(**zero_values, gamma=1.0, lam=1.0, whiten=False)
    rewards = inputs["token_level_rewards"] * mask
    expected = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(advantages, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(returns, expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    batch=st.integers(1, 5),
    length=st.integers(1, 70),
    mask_kind=masks,
    gamma=st.floats(0, 1),
)
def test_gae_with_lambda_zero_is_the_td_error(seed, batch, length, mask_kind, gamma):
    inputs = random_inputs(seed, [batch], length, mask_kind=mask_kind)
    mask, values = inputs["response_mask"], inputs["values"]
    advantages, _ = estimators.get("gae")(**inputs, gamma=gamma, lam=0.0, whiten=False)
    # V of the next valid token (0 after the last one), one row at a time.
    next_values = torch.zeros_like(values)
    for row in range(batch):
        positions = mask[row].nonzero().flatten()
        next_values[row, positions[:-1]] = values[row, positions[1:]]
    td_error = (inputs["token_level_rewards"] + gamma * next_values - values) * mask
    torch.testing.assert_close(advantages, td_error, rtol=1e-9, atol=1e-9)


def _pad(inputs, extra_rows, extra_cols, gen):
    """Append fully masked rows and columns filled with garbage rewards and values."""
    b, t = inputs["response_mask"].shape
    new_b, new_t = b + extra_rows, t + extra_cols

    def grow(x, fill):
        out = fill(new_b, new_t)
        out[:b, :t] = x
        return out

    noise = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64) * 100  # noqa: E731
    index = torch.cat([inputs["index"], torch.randint(0, 3, (extra_rows,), generator=gen)])
    return {
        "token_level_rewards": grow(inputs["token_level_rewards"], noise),
        "response_mask": grow(
            inputs["response_mask"], lambda *s: torch.zeros(*s, dtype=torch.bool)
        ),
        "values": grow(inputs["values"], noise),
        "index": index,
        "reward_baselines": torch.cat([inputs["reward_baselines"], noise(extra_rows)]),
    }


def _grow(x, shape, gen):
    """``x`` in the top-left corner of a ``shape`` tensor of garbage."""
    out = torch.randn(shape, generator=gen, dtype=torch.float64) * 100
    out[: x.shape[0], : x.shape[1]] = x
    return out


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    sizes=groups,
    length=lengths,
    mask_kind=masks,
    extra_rows=st.integers(0, 3),
    extra_cols=st.integers(0, 4),
)
def test_appending_fully_masked_rows_and_columns_changes_nothing_on_real_tokens(
    name, seed, sizes, length, mask_kind, extra_rows, extra_cols
):
    inputs = random_inputs(seed, sizes, length, mask_kind=mask_kind)
    gen = torch.Generator().manual_seed(seed)
    for key in declared_inputs(name):  # a (B, T) input, with garbage where it is padded
        inputs[key] = torch.randn(inputs["values"].shape, generator=gen, dtype=torch.float64)
    padded = _pad(inputs, extra_rows, extra_cols, gen)
    for key in declared_inputs(name):
        padded[key] = _grow(inputs[key], padded["response_mask"].shape, gen)
    b, t = inputs["response_mask"].shape
    for ours, theirs in zip(
        estimators.get(name)(**inputs, **KW), estimators.get(name)(**padded, **KW)
    ):
        torch.testing.assert_close(theirs[:b, :t], ours, rtol=1e-12, atol=1e-12)
        assert (theirs[b:] == 0).all() and (theirs[:, t:] == 0).all()
