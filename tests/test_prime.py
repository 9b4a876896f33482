"""PRIME: the ``prime`` estimator and the implicit PRM's rewards, losses and metrics.

The vectorised functions are compared with the loop references of
``estimators/reference/prime_loops.py`` (verl's ``recipe/prime`` formulas, one group and
one token at a time) to 1e-9 in float64 on random inputs, degenerate ones included;
small cases are worked out by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
import estimators
from algorithms import implicit_prm as prm
from estimators.reference import prime_loops as ref
from rlkit.registry import ESTIMATORS
from rlkit.testing import strategies as S

TOL = 1e-9
prime = estimators.get("prime")


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max(1, max |theirs|)."""
    if theirs.numel() == 0:
        return 0.0
    scale = max(1.0, theirs.abs().max().item())
    return (ours.double() - theirs.double()).abs().max().item() / scale


def log_sigmoid_loss(z: float) -> float:
    """-log sigmoid(z)."""
    return math.log1p(math.exp(-z))


# -- strategies -------------------------------------------------------------------------
@st.composite
def prm_batches(draw, max_rows=7, max_len=6):
    """(prm_log_probs, ref_log_probs, mask, acc, index): padding holds 0, garbage or -inf."""
    mask = draw(S.response_masks(max_rows=max_rows, max_len=max_len))
    ref_lp, prm_lp = draw(S.log_prob_pairs(mask))
    b = mask.shape[0]
    index = draw(S.group_indices(b))
    acc = S.fill_values(draw(st.sampled_from(["binary", "grid"])), (b,), draw(S.seeds()))
    acc = acc if bool(((acc == 0) | (acc == 1)).all()) else (acc.abs() / 4).clamp(max=1)
    return prm_lp, ref_lp, mask, acc, index


# -- the estimator: against the loops --------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    case=S.estimator_inputs(
        values=False, baselines=False, discounts=False, extra_inputs=("process_rewards",)
    ),
    coefs=st.sampled_from([(5.0, 5.0), (1.0, 0.0), (0.0, 2.0), (0.3, 7.0)]),
)
def test_prime_matches_the_verl_loop(case, coefs):
    # Every drawn batch: empty rows, groups of one, interior mask-0 spans included.
    options = dict(zip(("reward_dpo_coef", "reward_gt_coef"), coefs))
    advantages, returns = prime(**case, **options)
    ref_adv, ref_ret = ref.prime_advantages(
        case["token_level_rewards"],
        case["response_mask"],
        case["index"],
        case["process_rewards"],
        *coefs,
    )
    assert relative_error(returns, ref_ret) <= TOL
    assert relative_error(advantages, ref_adv) <= TOL
    pad = ~case["response_mask"]
    assert (advantages[pad] == 0).all() and (returns[pad] == 0).all()


def test_verl_contiguous_groups_and_shuffled_ids_agree():
    # verl takes groups as blocks of n rows; ids in any order give the same numbers.
    gen = torch.Generator().manual_seed(0)
    rewards = torch.zeros(6, 4, dtype=torch.float64)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    mask = torch.ones(6, 4, dtype=torch.bool)
    process = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    blocks = torch.arange(6) // 3
    order = torch.tensor([4, 0, 2, 5, 1, 3])
    a, r = prime(rewards, mask, index=blocks, process_rewards=process)
    a2, r2 = prime(rewards[order], mask[order], index=blocks[order], process_rewards=process[order])
    torch.testing.assert_close(a2, a[order], rtol=0, atol=1e-12)
    torch.testing.assert_close(r2, r[order], rtol=0, atol=1e-12)


# -- the estimator: by hand --------------------------------------------------------------
def test_outcome_only_group_of_three_by_hand():
    # acc [1, 0, 0] on the last of 2 tokens. RLOO: 1 - mean(0, 0) = 1, 0 - mean(1, 0) = -0.5,
    # so [1, -0.5, -0.5] at the last token, times reward_gt_coef 5: [5, -2.5, -2.5]; the
    # returns repeat it on both tokens. Whitening over the 6 tokens: mean 0 / (6 + 1e-8) = 0,
    # sum of squares 2·25 + 4·6.25 = 75, unbiased var 75 / (6 + 1e-8) · 6/5 (= 15).
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    advantages, returns = prime(
        rewards, mask, index=[7, 7, 7], process_rewards=torch.zeros(3, 2, dtype=torch.float64)
    )
    expected_returns = [[5.0, 5.0], [-2.5, -2.5], [-2.5, -2.5]]
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=torch.float64))
    std = math.sqrt(75 / (6 + 1e-8) * 6 / 5 + 1e-8)
    expected = [[5 / std] * 2, [-2.5 / std] * 2, [-2.5 / std] * 2]
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))


def test_process_only_group_of_two_by_hand():
    # p = [[1, 3], [0, 0]]: row means [2, 0], baseline (2 + 0) / (n - 1) = 2, n/(n-1) = 2:
    # row 0 -> [1·2 - 2, 3·2 - 2] = [0, 4], row 1 -> [0 - 2, 0 - 2] = [-2, -2].
    # Returns (reverse cumulative sums): [4, 4] and [-4, -2].
    rewards = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    process = torch.tensor([[1.0, 3.0], [0.0, 0.0]], dtype=torch.float64)
    advantages, returns = prime(
        rewards, mask, index=[0, 0], process_rewards=process, reward_dpo_coef=1.0
    )
    expected_returns = torch.tensor([[4.0, 4.0], [-4.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(returns, expected_returns)
    # Whitening: mean 2 / (4 + 1e-8); centred [3.5, 3.5, -4.5, -2.5] (up to that 1e-8).
    mean = 2 / (4 + 1e-8)
    centred = torch.tensor([[4.0, 4.0], [-4.0, -2.0]], dtype=torch.float64) - mean
    var = centred.square().sum() / (4 + 1e-8) * 4 / 3
    torch.testing.assert_close(advantages, centred / torch.sqrt(var + 1e-8))


def test_both_sources_add_with_their_coefficients():
    # Sources are computed separately and summed: 2·process + 3·outcome.
    gen = torch.Generator().manual_seed(1)
    rewards = torch.zeros(4, 3, dtype=torch.float64)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.ones(4, 3, dtype=torch.bool)
    process = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    kw = {"index": [0, 0, 1, 1], "process_rewards": process}
    _, both = prime(rewards, mask, **kw, reward_dpo_coef=2.0, reward_gt_coef=3.0)
    _, only_p = prime(rewards, mask, **kw, reward_dpo_coef=1.0, reward_gt_coef=0.0)
    _, only_o = prime(rewards, mask, **kw, reward_dpo_coef=0.0, reward_gt_coef=1.0)
    torch.testing.assert_close(both, 2 * only_p + 3 * only_o)
    # Group 1 has acc [1, 1]: its outcome leave-one-out is 0.
    assert (only_o[2:] == 0).all()
    # A source with coefficient 0 is left out, as in verl (even an inf in it).
    broken = {**kw, "process_rewards": torch.full((4, 3), torch.inf, dtype=torch.float64)}
    _, without = prime(rewards, mask, **broken, reward_dpo_coef=0.0, reward_gt_coef=1.0)
    torch.testing.assert_close(without, only_o, rtol=0, atol=0)


# -- the estimator: degenerate inputs and errors --------------------------------------
def test_a_group_of_one_has_zero_returns_but_is_whitened_with_the_batch():
    # verl divides by n - 1 = 0 here; rlkit gives both sources 0 for a lone response.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    process = torch.tensor([[0.5, 0.5], [9.0, -9.0], [0.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    advantages, returns = prime(rewards, mask, index=[0, 1, 0], process_rewards=process)
    assert (returns[1] == 0).all()
    assert torch.isfinite(advantages).all() and advantages[1, 0] == advantages[1, 1] != 0


def test_empty_rows_get_zero_and_change_nothing():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [50.0, 0.0]], dtype=torch.float64)
    process = torch.tensor([[0.5, 0.1], [0.2, -0.3], [torch.inf, torch.nan]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]], dtype=torch.bool)
    padded = prime(rewards, mask, index=[0, 0, 0], process_rewards=process)
    plain = prime(rewards[:2], mask[:2], index=[0, 0], process_rewards=process[:2])
    for big, small in zip(padded, plain):
        assert (big[2] == 0).all()
        torch.testing.assert_close(big[:2], small, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (0, 0)])
def test_empty_batches_give_empty_outputs(shape):
    zeros = torch.zeros(shape, dtype=torch.float64)
    advantages, returns = prime(
        zeros, zeros.bool(), index=list(range(shape[0])), process_rewards=zeros
    )
    assert advantages.shape == returns.shape == shape


def test_missing_process_rewards_says_prime_needs_the_implicit_prm():
    rewards, mask = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="prime needs `process_rewards`.*implicit PRM"):
        prime(rewards, mask, index=[0, 0])
    with pytest.raises(ValueError, match="`process_rewards` must be a"):
        prime(rewards, mask, index=[0, 0], process_rewards=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="prime needs `index`"):
        prime(rewards, mask, process_rewards=torch.zeros(2, 2))


def test_options_are_checked():
    kw = {"index": [0, 0], "process_rewards": torch.zeros(2, 2)}
    rewards, mask = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match="'dpo_coef' -> use reward_dpo_coef"):
        prime(rewards, mask, **kw, dpo_coef=5.0)  # verl's older spelling
    with pytest.raises(TypeError, match="reward_gt_coef must be a finite number"):
        prime(rewards, mask, **kw, reward_gt_coef=True)
    with pytest.raises(TypeError, match="reward_dpo_coef must be a finite number"):
        prime(rewards, mask, **kw, reward_dpo_coef=float("nan"))


def test_half_precision_rewards_come_back_in_their_dtype():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.bfloat16)
    mask = torch.ones(2, 2, dtype=torch.bool)
    process = torch.tensor([[0.1, 0.2], [0.3, 0.0]])
    advantages, returns = prime(rewards, mask, index=[0, 0], process_rewards=process)
    assert advantages.dtype == returns.dtype == torch.bfloat16


def test_registration_declares_the_process_rewards_input_and_verl_defaults():
    entry = ESTIMATORS.entry("prime")
    assert entry.extra["inputs"] == ("process_rewards",)
    assert entry.paper == "arXiv:2502.01456"
    from estimators.prime import DEFAULT_REWARD_DPO_COEF, DEFAULT_REWARD_GT_COEF

    assert DEFAULT_REWARD_DPO_COEF == DEFAULT_REWARD_GT_COEF == 5.0


def test_the_preset_binds_prime_with_verl_defaults():
    import gin

    from rlkit.train import PRESETS_DIR, parse_config
    from rlkit.trainer.config import ExperimentConfig

    gin.clear_config()
    try:
        parse_config([str(PRESETS_DIR / "prime.gin")], [])
        algorithm = ExperimentConfig().algorithm
    finally:
        gin.clear_config()
    assert algorithm.adv_estimator == "prime"
    assert algorithm.estimator_options == {"reward_dpo_coef": 5.0, "reward_gt_coef": 5.0}
    assert algorithm.entropy_coeff == 0.001
    assert not algorithm.use_kl_in_reward and not algorithm.use_kl_loss


# -- implicit process rewards -------------------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(
    batch=prm_batches(),
    beta=st.sampled_from([0.05, 0.5, 1.0]),
    granularity=st.sampled_from(prm.GRANULARITIES),
    norm=st.sampled_from(prm.NORMS),
    include_last_token=st.booleans(),
)
def test_process_rewards_match_the_verl_loop(batch, beta, granularity, norm, include_last_token):
    prm_lp, ref_lp, mask, _, _ = batch
    kw = {"granularity": granularity, "norm": norm, "include_last_token": include_last_token}
    ours = algorithms.implicit_process_rewards(prm_lp, ref_lp, mask, beta=beta, **kw)
    theirs = ref.implicit_process_rewards(prm_lp, ref_lp, mask, beta, **kw)
    assert relative_error(ours, theirs) <= TOL
    assert torch.isfinite(ours).all() and (ours[~mask] == 0).all()


def test_process_rewards_by_hand():
    # q = log pi_prm - log pi_ref = [0.5, -1, 1.5] on the 3 valid tokens; beta = 0.1:
    # r = [0.05, -0.1, 0.15].
    prm_lp = torch.tensor([[-1.0, -2.0, -0.5, -torch.inf]], dtype=torch.float64)
    ref_lp = torch.tensor([[-1.5, -1.0, -2.0, -torch.inf]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)

    def rewards(**kw):
        return algorithms.implicit_process_rewards(prm_lp, ref_lp, mask, beta=0.1, **kw)[0]

    close = lambda got, want: torch.testing.assert_close(got, torch.tensor(want).double())  # noqa: E731
    # verl's "token": every valid token but the last one.
    close(rewards(norm="none"), [0.05, -0.1, 0.0, 0.0])
    close(rewards(norm="none", include_last_token=True), [0.05, -0.1, 0.15, 0.0])
    # "whole": the sum 0.1 on the last valid token.
    close(rewards(norm="none", granularity="whole"), [0.0, 0.0, 0.1, 0.0])
    # batch_norm: reverse cumulative sums of [0.05, -0.1, 0, 0] are [-0.05, -0.1, 0, 0],
    # largest |.| = 0.1, so divide by 0.1 + 1e-6.
    close(rewards(), [0.05 / 0.100001, -0.1 / 0.100001, 0.0, 0.0])


def test_the_last_valid_token_follows_interior_mask_spans():
    # Valid tokens 0, 1 and 3 (token 2 is a tool output): the last valid one is 3.
    mask = torch.tensor([[1, 1, 0, 1, 0]], dtype=torch.bool)
    prm_lp = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]], dtype=torch.float64)
    scores = algorithms.implicit_process_rewards(
        prm_lp, torch.zeros_like(prm_lp), mask, beta=1.0, norm="none"
    )
    torch.testing.assert_close(scores, torch.tensor([[0.1, 0.2, 0.0, 0.0, 0.0]]).double())
    whole = algorithms.implicit_process_rewards(
        prm_lp, torch.zeros_like(prm_lp), mask, beta=1.0, norm="none", granularity="whole"
    )
    torch.testing.assert_close(whole, torch.tensor([[0.0, 0.0, 0.0, 0.7, 0.0]]).double())


def test_process_rewards_reject_bad_settings():
    x, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="beta must be > 0"):
        algorithms.implicit_process_rewards(x, x, mask, beta=0.0)
    with pytest.raises(ValueError, match="granularity must be one of token, whole"):
        algorithms.implicit_process_rewards(x, x, mask, beta=0.05, granularity="step")
    with pytest.raises(ValueError, match="norm must be one of batch_norm, none"):
        algorithms.implicit_process_rewards(x, x, mask, beta=0.05, norm="batch")
    with pytest.raises(ValueError, match="one shape"):
        algorithms.implicit_process_rewards(x, torch.zeros(1, 3), mask, beta=0.05)


def test_batch_norm_of_an_all_zero_or_empty_batch():
    assert (prm.batch_norm(torch.zeros(2, 3)) == 0).all()
    assert prm.batch_norm(torch.zeros(0, 3)).shape == (0, 3)


# -- the PRM losses ---------------------------------------------------------------------
def _with_grad(prm_lp):
    return prm_lp.clone().requires_grad_(True)


def _loop_grad(loss, leaf):
    """d loss / d leaf of a loop reference (zeros when no valid token reached the loss)."""
    if not loss.requires_grad:
        return torch.zeros_like(leaf)
    grad = torch.autograd.grad(loss, leaf, allow_unused=True)[0]
    return torch.zeros_like(leaf) if grad is None else grad


@settings(max_examples=100, deadline=None)
@given(batch=prm_batches(), beta=st.sampled_from([0.05, 0.5, 2.0]))
def test_ce_loss_and_gradient_match_the_verl_loop(batch, beta):
    prm_lp, ref_lp, mask, acc, _ = batch
    ours_lp, theirs_lp = _with_grad(prm_lp), _with_grad(prm_lp)
    ours, metrics = algorithms.implicit_prm_loss(ours_lp, ref_lp, mask, acc, beta=beta)
    theirs = ref.ce_loss(theirs_lp, ref_lp, mask, acc, beta)
    assert abs(ours.item() - theirs.item()) <= TOL * max(1.0, abs(theirs.item()))
    assert metrics[prm.METRIC_DPO_LOSS].item() == ours.item()
    (g_ours,) = torch.autograd.grad(ours, ours_lp)
    g_theirs = _loop_grad(theirs, theirs_lp)
    assert relative_error(g_ours, g_theirs) <= TOL and (g_ours[~mask] == 0).all()


@settings(max_examples=100, deadline=None)
@given(batch=prm_batches(), beta=st.sampled_from([0.05, 0.5, 2.0]))
def test_detached_dpo_loss_and_gradient_match_the_verl_loop(batch, beta):
    prm_lp, ref_lp, mask, acc, index = batch
    acc = (acc > 0.5).double()  # verl's acc is 0/1
    q = algorithms.implicit_q(prm_lp, ref_lp, mask)
    opponents = algorithms.dpo_opponent_q(q, acc, mask, index)
    expected = ref.opponent_q(q, acc, mask, index)
    assert relative_error(opponents, torch.tensor(expected, dtype=torch.float64)) <= TOL
    ours_lp, theirs_lp = _with_grad(prm_lp), _with_grad(prm_lp)
    ours, _ = algorithms.implicit_prm_loss(
        ours_lp, ref_lp, mask, acc, beta=beta, loss_type="dpo", opponent_q=opponents
    )
    theirs = ref.dpo_loss(theirs_lp, ref_lp, mask, acc, expected, beta)
    assert abs(ours.item() - theirs.item()) <= TOL * max(1.0, abs(theirs.item()))
    (g_ours,) = torch.autograd.grad(ours, ours_lp)
    g_theirs = _loop_grad(theirs, theirs_lp)
    assert relative_error(g_ours, g_theirs) <= TOL


def test_ce_loss_by_hand():
    # One valid token each. Row 0: q = 20, beta 0.05 -> z = 1, acc 1: -log sigmoid(1).
    # Row 1: q = 0 -> sigmoid 0.5: log 2 whatever acc. Mean over the 2 rows.
    prm_lp = torch.tensor([[-1.0], [-3.0]], dtype=torch.float64)
    ref_lp = torch.tensor([[-21.0], [-3.0]], dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.bool)
    loss, _ = algorithms.implicit_prm_loss(
        prm_lp, ref_lp, mask, torch.tensor([1.0, 0.0]), beta=0.05
    )
    assert loss.item() == pytest.approx((log_sigmoid_loss(1.0) + math.log(2)) / 2, rel=1e-12)


def test_dpo_loss_by_hand():
    # One group, acc [1, 0, 0], Q = sum q = [2, 1, -1], beta 0.5.
    # Row 0 (acc > 0): opponents are the rows with lower acc, mean Q (1 - 1)/2 = 0:
    #   margin 0.5·(2 - 0)·(+1) = 1.
    # Row 1 (acc = 0): opponents have higher acc: row 0, Q 2: margin 0.5·(1 - 2)·(-1) = 0.5.
    # Row 2: margin 0.5·(-1 - 2)·(-1) = 1.5. Loss: mean of -log sigmoid(margin).
    prm_lp = torch.tensor([[1.0, 1.0], [0.5, 0.5], [-1.0, 0.0]], dtype=torch.float64)
    ref_lp = torch.zeros(3, 2, dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    acc, index = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([4, 4, 4])
    q = algorithms.implicit_q(prm_lp, ref_lp, mask)
    opponents = algorithms.dpo_opponent_q(q, acc, mask, index)
    assert opponents.tolist() == [0.0, 2.0, 2.0]
    loss, _ = algorithms.implicit_prm_loss(
        prm_lp, ref_lp, mask, acc, beta=0.5, loss_type="dpo", opponent_q=opponents
    )
    expected = sum(log_sigmoid_loss(m) for m in (1.0, 0.5, 1.5)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_a_row_without_opponents_is_compared_with_zero():
    # verl: other_Q = 0 when the group has no row of the other outcome.
    q = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.bool)
    opponents = algorithms.dpo_opponent_q(q, torch.tensor([1.0, 1.0]), mask, torch.tensor([0, 0]))
    assert opponents.tolist() == [0.0, 0.0]


@settings(max_examples=80, deadline=None)
@given(
    batch=prm_batches(max_rows=8),
    loss_type=st.sampled_from(prm.LOSS_TYPES),
    data=st.data(),
)
def test_micro_batches_with_the_mini_batch_num_seqs_sum_to_the_whole_loss(batch, loss_type, data):
    prm_lp, ref_lp, mask, acc, index = batch
    acc = (acc > 0.5).double()
    slices = data.draw(S.micro_batch_splits(mask.shape[0]))
    opponents = algorithms.dpo_opponent_q(
        algorithms.implicit_q(prm_lp, ref_lp, mask), acc, mask, index
    )
    num_seqs = max(int(mask.any(-1).sum()), 1)  # Algorithm.normalisers' num_seqs
    leaf = _with_grad(prm_lp)

    def loss(rows, **kw):
        return algorithms.implicit_prm_loss(
            leaf[rows], ref_lp[rows], mask[rows], acc[rows], beta=0.5,
            loss_type=loss_type, opponent_q=opponents[rows], **kw,
        )[0]  # fmt: skip

    whole = loss(slice(None))
    parts = sum(loss(s, num_seqs=num_seqs) for s in slices)
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)
    (g_whole,) = torch.autograd.grad(whole, leaf, retain_graph=True)
    (g_parts,) = torch.autograd.grad(parts, leaf)
    torch.testing.assert_close(g_parts, g_whole, rtol=1e-12, atol=1e-12)


def test_equal_micro_batches_reproduce_verls_mean_of_micro_batch_means():
    # verl: each micro-batch's mean BCE divided by the number of micro-batches.
    gen = torch.Generator().manual_seed(3)
    prm_lp = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    ref_lp = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    mask = torch.ones(6, 4, dtype=torch.bool)
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    ours = sum(
        algorithms.implicit_prm_loss(prm_lp[s], ref_lp[s], mask[s], acc[s], beta=0.05, num_seqs=6)[
            0
        ]
        for s in (slice(0, 2), slice(2, 4), slice(4, 6))
    )
    verl = 0.0
    for s in (slice(0, 2), slice(2, 4), slice(4, 6)):
        scores = torch.sigmoid(((prm_lp[s] - ref_lp[s]) * mask[s]).sum(-1) * 0.05)
        verl += torch.nn.functional.binary_cross_entropy(scores, acc[s].double()) / 3
    torch.testing.assert_close(ours, verl, rtol=1e-12, atol=1e-12)


def test_the_ce_loss_stays_exact_where_verls_bce_saturates():
    # beta·Q = -200 with acc 1: the loss is 200 (verl's clamped log gives 100).
    prm_lp = torch.tensor([[-200.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = algorithms.implicit_prm_loss(
        prm_lp, torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), torch.ones(1), beta=1.0
    )
    assert loss.item() == pytest.approx(200.0)
    (grad,) = torch.autograd.grad(loss, prm_lp)
    assert grad.item() == pytest.approx(-1.0)


def test_losses_reject_bad_arguments():
    x, mask, acc = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool), torch.zeros(2)
    with pytest.raises(ValueError, match="needs opponent_q"):
        algorithms.implicit_prm_loss(x, x, mask, acc, beta=0.05, loss_type="dpo")
    with pytest.raises(ValueError, match="loss_type must be one of ce, dpo"):
        algorithms.implicit_prm_loss(x, x, mask, acc, beta=0.05, loss_type="bon_acc")
    with pytest.raises(ValueError, match=r"acc must be a \(B,\)"):
        algorithms.implicit_prm_loss(x, x, mask, torch.zeros(3), beta=0.05)
    with pytest.raises(TypeError, match="beta must be a finite number"):
        algorithms.implicit_prm_loss(x, x, mask, acc, beta=None)


def test_empty_rows_add_nothing_to_the_loss_or_num_seqs():
    prm_lp = torch.tensor([[0.3, 0.1], [5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    acc = torch.tensor([1.0, 0.0])
    both, _ = algorithms.implicit_prm_loss(prm_lp, torch.zeros(2, 2), mask, acc, beta=0.5)
    one, _ = algorithms.implicit_prm_loss(
        prm_lp[:1], torch.zeros(1, 2), mask[:1], acc[:1], beta=0.5
    )
    assert both.item() == one.item()


# -- ranking metrics -------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(batch=prm_batches(max_rows=8), ties=st.booleans())
def test_accuracies_match_the_verl_loop(batch, ties):
    prm_lp, ref_lp, mask, acc, index = batch
    scores = algorithms.implicit_process_rewards(prm_lp, ref_lp, mask, beta=0.5, norm="none")
    if ties:  # scores on a coarse grid: equal row sums exercise verl's tie rule
        scores = torch.round(scores * 2) / 2
    pairwise = algorithms.compute_dpo_accuracy(scores, acc, mask, index)
    assert pairwise.item() == pytest.approx(ref.dpo_accuracy(scores, acc, mask, index), abs=TOL)
    absolute = algorithms.compute_dpo_abs_accuracy(scores, acc, mask)
    assert absolute.item() == pytest.approx(ref.dpo_abs_accuracy(scores, acc, mask), abs=TOL)


def test_pairwise_accuracy_by_hand():
    # Group a: acc [1, 0, 0], S [3, 1, 2]. Pairs (0,1): acc gap 1, S gap 2 > 0, right;
    # (0,2): gap 1, S gap 1 > 0, right; (1,2): gap 0, weight 0. Accuracy 2/2 = 1.
    # Group b: acc [0, 1], S [0.5, -1]: gap -1, S gap 1.5 > 0: wrong, accuracy 0.
    # Group c: acc [1, 1]: no weight, 0.5. Mean over the groups: (1 + 0 + 0.5) / 3.
    scores = torch.tensor([[3.0], [1.0], [2.0], [0.5], [-1.0], [0.2], [0.7]])
    acc = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    mask = torch.ones(7, 1, dtype=torch.bool)
    accuracy = algorithms.compute_dpo_accuracy(scores, acc, mask, index)
    assert accuracy.item() == pytest.approx(1.5 / 3)


def test_pairwise_ties_depend_on_the_row_order_as_in_verl():
    # Equal scores: (S gap > 0) is False; right iff (acc gap > 0) is False too.
    mask, index, scores = (
        torch.ones(2, 1, dtype=torch.bool),
        torch.tensor([0, 0]),
        torch.zeros(2, 1),
    )
    assert algorithms.compute_dpo_accuracy(scores, torch.tensor([0.0, 1.0]), mask, index) == 1.0
    assert algorithms.compute_dpo_accuracy(scores, torch.tensor([1.0, 0.0]), mask, index) == 0.0


def test_absolute_accuracy_by_hand():
    # sign(S) vs sign(2 acc - 1): 0.3 ~ +1 yes; -0.2 ~ -1 yes; 0 ~ +1 no; 0.1 ~ -1 no.
    scores = torch.tensor([[0.3], [-0.2], [0.0], [0.1]])
    acc = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(4, 1, dtype=torch.bool)
    assert algorithms.compute_dpo_abs_accuracy(scores, acc, mask).item() == 0.5


def test_accuracies_without_rows_are_chance():
    empty, acc, index = torch.zeros(2, 3), torch.zeros(2), torch.tensor([0, 1])
    mask = torch.zeros(2, 3, dtype=torch.bool)
    assert algorithms.compute_dpo_accuracy(empty, acc, mask, index).item() == 0.5
    assert algorithms.compute_dpo_abs_accuracy(empty, acc, mask).item() == 0.5


def test_reward_model_metrics_use_verls_names():
    prm_lp = torch.tensor([[0.2, 0.4], [-0.1, 0.0], [0.0, 0.0]], dtype=torch.float64)
    ref_lp = torch.zeros(3, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]], dtype=torch.bool)
    acc, index = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 0])
    q = algorithms.implicit_q(prm_lp, ref_lp, mask)
    rewards = algorithms.implicit_process_rewards(prm_lp, ref_lp, mask, beta=0.5, norm="none")
    metrics = algorithms.reward_model_metrics(rewards, q, acc, mask, index)
    assert set(metrics) == {
        "reward_model/reward", "reward_model/raw_reward",
        "reward_model/dpo_acc", "reward_model/dpo_acc_abs",
    }  # fmt: skip
    # q sums 0.6 and -0.1 over the two non-empty rows: mean 0.25; rewards (last token
    # dropped): 0.5·0.2 = 0.1 and 0.5·(-0.1) = -0.05, mean 0.025. Row 0 outranks row 1.
    assert metrics["reward_model/raw_reward"].item() == pytest.approx(0.25)
    assert metrics["reward_model/reward"].item() == pytest.approx(0.025)
    assert metrics["reward_model/dpo_acc"].item() == 1.0
    assert metrics["reward_model/dpo_acc_abs"].item() == 1.0
    before = algorithms.reward_model_metrics(rewards, q, acc, mask, index, before_update=True)
    assert {"reward_model/dpo_acc_before", "reward_model/dpo_acc_abs_before"} <= set(before)
    assert set(prm.METRIC_NAMES) >= set(metrics) | set(before) | {"reward_model/dpo_loss"}
