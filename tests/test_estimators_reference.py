"""Every estimator gives verl's numbers (its loop reference) on non-degenerate inputs.

Non-degenerate: every group has >= 2 responses, no response is empty, rewards
are zero on mask-0 tokens. Error is measured on valid tokens as
max |ours - reference| / max(1, max |reference|): <= 1e-9 in float64 and
<= 1e-5 in float32, times the scores' condition number for the outcome estimators
(``score_condition``). Mask-0 tokens must be exactly 0 in both outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import estimators
from estimators.reference import estimator_loops as ref

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}
OUTCOME = [
    "grpo",
    "dr_grpo",
    "grpo_batch_std",
    "grpo_passk",
    "rloo",
    "opo",
    "reinforce_plus_plus_baseline",
    "gpg",
]
# Settings exercised per estimator (the loop reference receives the same ones).
SETTINGS = {
    "gae": [{"gamma": 1.0, "lam": 1.0}, {"gamma": 0.97, "lam": 0.9}, {"gamma": 0.8, "lam": 0.0}],
    "reinforce_plus_plus": [{"gamma": 1.0}, {"gamma": 0.9}],
    "grpo": [{}, {"norm_by_std": False}, {"epsilon": 1e-4}],
    "grpo_passk": [{}, {"norm_by_std": False}],
    "gpg": [{}, {"f_norm": 3.0}],
}


def score_condition(inputs) -> float:
    """kappa = max |score| / the smallest nonzero score std of a group or of the batch (>= 1).

    An outcome estimator centres scores on a (group or batch) mean and may divide by a std:
    ``s - mean`` is off by up to ~(n + 1) u max|s| in float32 (u = 2^-24, n <= 5 rows per
    group here), which the division turns into a relative error of ~(n + 1) u kappa of the
    advantages. 1e-5 covers kappa up to ~10; dense random scores of a group can nearly tie
    (kappa in the thousands: a fixed 1e-5 failed 3 in 3,000 float32 cases, ~1% of runs),
    so the tolerance is 1e-5 kappa (worst of 3,000 cases: 0.02 of it). Groups of equal
    scores (std 0) give exactly 0 in both and do not count.
    """
    mask = inputs["response_mask"]
    scores = (inputs["token_level_rewards"].double() * mask).sum(-1)
    groups = [scores] + [scores[inputs["index"] == g] for g in inputs["index"].unique()]
    stds = [g.std().item() for g in groups if len(g) > 1]
    stds = [s for s in stds if s > 0]
    return max(1.0, scores.abs().max().item() / min(stds)) if stds else 1.0


def assert_matches_reference(name, inputs, dtype, **kw):
    advantages, returns = estimators.get(name)(**inputs, **kw)
    ref_adv, ref_ret = ref.call(name, inputs, **kw)
    mask = inputs["response_mask"]
    tolerance = TOLERANCE[dtype] * (score_condition(inputs) if name in OUTCOME else 1.0)
    for ours, theirs in ((advantages, ref_adv), (returns, ref_ret)):
        assert ours.dtype == dtype and ours.shape == mask.shape
        assert torch.isfinite(ours).all()
        assert (ours[~mask] == 0).all(), "outputs must be exactly 0 on mask-0 tokens"
        scale = max(1.0, theirs[mask].abs().max().item()) if mask.any() else 1.0
        error = (ours - theirs)[mask].abs().max().item() / scale if mask.any() else 0.0
        assert error <= tolerance, f"{name} {kw}: relative error {error:.2e} > {tolerance:.2e}"


groups = st.lists(st.integers(2, 5), min_size=1, max_size=6)
seeds = st.integers(0, 2**31 - 1)
dtypes = st.sampled_from([torch.float64, torch.float32])


@pytest.mark.parametrize("name", OUTCOME)
@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    sizes=groups,
    length=st.integers(1, 12),
    dtype=dtypes,
    reward_kind=st.sampled_from(["dense", "outcome"]),
    mask_kind=st.sampled_from(["right_padded", "contiguous", "holes"]),
)
def test_outcome_estimator_matches_verl_loop(
    name, seed, sizes, length, dtype, reward_kind, mask_kind
):
    inputs = ref.random_inputs(seed, sizes, length, dtype, mask_kind, reward_kind)
    for options in SETTINGS.get(name, [{}]):
        assert_matches_reference(name, inputs, dtype, **options)


@settings(max_examples=60, deadline=None)
@given(
    seed=seeds,
    batch=st.integers(1, 6),
    length=st.integers(1, 80),
    dtype=dtypes,
    mask_kind=st.sampled_from(["right_padded", "contiguous", "holes"]),
)
def test_gae_matches_verl_loop_including_interior_mask_spans(seed, batch, length, dtype, mask_kind):
    inputs = ref.random_inputs(seed, [batch], length, dtype, mask_kind)
    if inputs["response_mask"].sum() < 2:
        return  # verl's whitening divides by zero below two tokens (tested elsewhere)
    for options in SETTINGS["gae"]:
        assert_matches_reference("gae", inputs, dtype, **options)


@settings(max_examples=60, deadline=None)
@given(
    seed=seeds,
    batch=st.integers(1, 6),
    length=st.integers(1, 80),
    dtype=dtypes,
    mask_kind=st.sampled_from(["right_padded", "contiguous"]),
)
def test_reinforce_plus_plus_matches_verl_loop_on_contiguous_masks(
    seed, batch, length, dtype, mask_kind
):
    # verl resets its return at mask-0 tokens, rlkit skips them; for one
    # contiguous run of valid tokens per row the two are the same computation.
    inputs = ref.random_inputs(seed, [batch], length, dtype, mask_kind)
    if inputs["response_mask"].sum() < 2:
        return
    for options in SETTINGS["reinforce_plus_plus"]:
        assert_matches_reference("reinforce_plus_plus", inputs, dtype, **options)


@settings(max_examples=60, deadline=None)
@given(
    seed=seeds,
    batch=st.integers(1, 6),
    length=st.integers(1, 80),
    dtype=dtypes,
    mask_kind=st.sampled_from(["right_padded", "contiguous", "holes"]),
)
def test_remax_matches_verl_loop(seed, batch, length, dtype, mask_kind):
    inputs = ref.random_inputs(seed, [batch], length, dtype, mask_kind)
    assert_matches_reference("remax", inputs, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gae_over_4096_steps_matches_loop_and_stays_finite(dtype):
    # gamma * lam = 0.9405: the decay over the whole row is ~1e-109, far below
    # float32's range; an implementation using (gamma * lam)^(-t) would overflow.
    inputs = ref.random_inputs(7, [3], 4096, dtype, "holes")
    assert_matches_reference("gae", inputs, dtype, gamma=0.99, lam=0.95)
    assert_matches_reference("gae", inputs, dtype, gamma=0.5, lam=0.5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reinforce_plus_plus_over_4096_steps_matches_loop(dtype):
    inputs = ref.random_inputs(8, [3], 4096, dtype, "right_padded")
    assert_matches_reference("reinforce_plus_plus", inputs, dtype, gamma=0.9)


@pytest.mark.parametrize("name", OUTCOME)
def test_index_forms_tensor_numpy_and_uid_strings_agree(name):
    inputs = ref.random_inputs(3, [3, 2, 4], 6)
    ids = inputs["index"]
    from_tensor = estimators.get(name)(**inputs)[0]
    for other in (
        ids.numpy(),
        [f"uid-{i}" for i in ids.tolist()],
        np.array([f"uid-{i}" for i in ids.tolist()], dtype=object),
        tuple((i, "prompt") for i in ids.tolist()),
    ):
        result = estimators.get(name)(**{**inputs, "index": other})[0]
        torch.testing.assert_close(result, from_tensor, rtol=0, atol=0)


def test_half_precision_rewards_are_computed_in_float32_and_returned_in_their_dtype():
    inputs = ref.random_inputs(5, [4, 4], 8, torch.float32)
    half = {**inputs, "token_level_rewards": inputs["token_level_rewards"].bfloat16()}
    advantages, returns = estimators.get("grpo")(**half)
    assert advantages.dtype == torch.bfloat16 and returns.dtype == torch.bfloat16
    full = estimators.get("grpo")(
        **{**inputs, "token_level_rewards": half["token_level_rewards"].float()}
    )[0]
    torch.testing.assert_close(advantages, full.bfloat16())
