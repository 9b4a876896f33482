"""Degenerate inputs: one documented behaviour for every estimator, never NaN or inf."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import estimators
from rlkit.testing import declared_inputs

ALL = estimators.names()
GROUPED = ["grpo", "dr_grpo", "grpo_batch_std", "grpo_passk", "rloo", "opo", "gpg"]


def run(name, inputs, **kw):
    """``name`` on ``inputs``, with a (B, T) tensor for each input it declares."""
    rewards = inputs["token_level_rewards"]
    extra = {key: 0.5 * rewards - 0.25 for key in declared_inputs(name)}
    return estimators.get(name)(**inputs, **extra, **kw)


def inputs_for(rewards, mask, index=None, dtype=torch.float64):
    rewards = torch.as_tensor(rewards, dtype=dtype)
    mask = torch.as_tensor(mask, dtype=torch.bool)
    batch = rewards.shape[0]
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": list(range(batch)) if index is None else index,
        "values": 0.5 * rewards - 1.0,
        "reward_baselines": torch.full((batch,), 0.25, dtype=dtype),
    }


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(0, 7),
    length=st.integers(0, 9),
    num_groups=st.integers(1, 4),
    reward_kind=st.sampled_from(["equal", "binary", "normal", "huge"]),
    keep=st.floats(0, 1),
    epsilon=st.sampled_from([0.0, 1e-6]),
    gamma=st.sampled_from([0.0, 0.5, 1.0]),
    lam=st.sampled_from([0.0, 0.9, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_no_estimator_produces_nan_or_inf_on_degenerate_batches(
    seed, batch, length, num_groups, reward_kind, keep, epsilon, gamma, lam, dtype
):
    # Empty rows, empty batches, zero-length rows, singleton groups, groups of
    # equal scores, epsilon = 0, a single valid token, huge rewards.
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=gen) < keep
    rewards = {
        "equal": torch.ones(batch, length),
        "binary": torch.randint(0, 2, (batch, length), generator=gen).float(),
        "normal": torch.randn(batch, length, generator=gen),
        "huge": torch.randn(batch, length, generator=gen) * 1e30,
    }[reward_kind]
    inputs = inputs_for(
        rewards.to(dtype), mask, torch.randint(0, num_groups, (batch,), generator=gen), dtype
    )
    for name in ALL:
        advantages, returns = run(name, inputs, epsilon=epsilon, gamma=gamma, lam=lam)
        for out in (advantages, returns):
            assert out.shape == (batch, length) and out.dtype == dtype
            if reward_kind != "huge":  # 1e30 * length may overflow float32 sums by itself
                assert torch.isfinite(out).all(), name
            assert not out.isnan().any(), name
            assert (out[~mask] == 0).all(), name


@pytest.mark.parametrize("name", GROUPED + ["reinforce_plus_plus_baseline"])
def test_singleton_groups_get_zero_advantage(name):
    # Rows 0 and 1 are alone in their groups; rows 2 and 3 form a real group.
    inputs = inputs_for(
        [[3.0, 0.0], [-2.0, 1.0], [1.0, 0.0], [0.0, 0.0]],
        [[1, 1], [1, 1], [1, 1], [1, 0]],
        index=["a", "b", "c", "c"],
    )
    advantages, _ = estimators.get(name)(**inputs)
    if name == "reinforce_plus_plus_baseline":
        # Centred to 0 before whitening, so they land on the whitened value of 0.
        assert torch.allclose(advantages[0], advantages[1])
    else:
        assert (advantages[:2] == 0).all()
    if name != "grpo_passk":
        assert (advantages[2:, 0] != 0).all()


@pytest.mark.parametrize("name", ["grpo", "grpo_passk", "grpo_batch_std"])
@pytest.mark.parametrize("epsilon", [0.0, 1e-6])
def test_groups_of_equal_scores_get_exactly_zero_from_std_normalised_estimators(name, epsilon):
    # Scores 0.1 + 0.2 in every row: a rounding residue in mean - score, divided
    # by a std of ~0 + epsilon, would not be 0 without the exact centring.
    inputs = inputs_for([[0.1, 0.2]] * 3, [[1, 1]] * 3, index=[7, 7, 7])
    advantages, returns = estimators.get(name)(**inputs, epsilon=epsilon)
    assert (advantages == 0).all() and (returns == 0).all()


@pytest.mark.parametrize("name", ALL)
def test_fully_masked_rows_get_zero_and_do_not_count_in_their_group(name):
    # Row 2 is empty but shares group "g" with rows 0 and 1; its garbage reward
    # 100 must not move the group's statistics.
    with_empty = inputs_for(
        [[1.0, 0.0], [0.0, 0.0], [100.0, 0.0]], [[1, 1], [1, 0], [0, 0]], ["g"] * 3
    )
    without = inputs_for([[1.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]], ["g"] * 2)
    for padded, plain in zip(run(name, with_empty), run(name, without)):
        assert (padded[2] == 0).all()
        torch.testing.assert_close(padded[:2], plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(0, 5), (0, 0), (3, 0)])
def test_empty_batches_and_zero_length_rows_give_empty_outputs(name, shape):
    inputs = inputs_for(torch.zeros(shape), torch.zeros(shape), list(range(shape[0])))
    advantages, returns = run(name, inputs)
    assert advantages.shape == shape and returns.shape == shape


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus"])
def test_whitening_a_single_valid_token_centres_it_to_zero(name):
    inputs = inputs_for([[2.0, 5.0, 0.0]], [[1, 0, 0]])
    advantages, returns = estimators.get(name)(**inputs)
    assert (advantages == 0).all()
    # Returns are taken before whitening. GAE: V = 0.5 * 2 - 1 = 0, A = r + 0 - V = 2,
    # return = A + V = 2. REINFORCE++: the return is the reward, 2.
    assert returns[0, 0].item() == pytest.approx(2.0) and (returns[0, 1:] == 0).all()


def test_whitening_a_batch_with_no_valid_tokens_gives_zeros():
    inputs = inputs_for([[1.0, 2.0], [3.0, 4.0]], [[0, 0], [0, 0]])
    for name in ALL:
        advantages, returns = run(name, inputs)
        assert (advantages == 0).all() and (returns == 0).all()


def test_grpo_passk_with_a_single_response_gives_zero_where_verl_raises():
    inputs = inputs_for([[1.0]], [[1]], ["only"])
    advantages, _ = estimators.get("grpo_passk")(**inputs)
    assert advantages.item() == 0.0
