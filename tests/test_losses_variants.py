"""gspo, kl_cov, clip_cov, cispo, gpg, sapo, geo_mean: hand-computed cases and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference.policy_loss_inputs import random_batch


def rows(old, new, adv, mask=None):
    """float64 tensors from nested lists; ``new`` requires grad."""
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    mask = (
        torch.ones(len(old), len(old[0]), dtype=torch.bool) if mask is None else torch.tensor(mask)
    )
    return t(old), t(new).requires_grad_(), t(adv), mask


def grad_of(loss, new):
    return torch.autograd.grad(loss, new)[0]


# -- gspo --------------------------------------------------------------------------------
def test_gspo_uses_the_length_normalised_sequence_ratio():
    # row 0: Δ = (ln 1.2, 0) -> log s = ln(1.2)/2, s = √1.2 = 1.095445 (inside [0.8, 1.2]);
    #        A = 1 -> L = −s on both tokens; dL/dlogπ_t = −A·s (the token-level gradient).
    # row 1: Δ = (ln 2, ln 2) -> s = 2 > 1.2, A = 1 -> L = −1.2, gradient 0.
    # token-sum: −2·√1.2 − 2·1.2 = −4.590890
    old, new, adv = (
        [[0.0, 0.0], [0.0, 0.0]],
        [[math.log(1.2), 0.0], [math.log(2)] * 2],
        [[1, 1]] * 2,
    )
    old, new, adv, mask = rows(old, new, adv)
    loss, metrics = algorithms.get_loss("gspo")(old, new, adv, mask, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(-2 * math.sqrt(1.2) - 2.4, rel=1e-12)
    expected = torch.tensor([[-math.sqrt(1.2)] * 2, [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad_of(loss, new), expected)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)  # the 2 tokens of row 1
    assert metrics["pg_clipfrac_lower"].item() == 0.0


# -- kl_cov --------------------------------------------------------------------------------
def test_kl_cov_penalises_the_top_covariance_token():
    # log π = (−1, −2, −0.5, −3), Δ = (0.1, −0.2, 0.3, 0), A = (1, −1, 2, 0).
    # means: Ā = 0.5, mean log π = −1.625; cov = (A − Ā)(log π + 1.625)
    #   = (0.5·0.625, −1.5·−0.375, 1.5·1.125, −0.5·−1.375) = (0.3125, 0.5625, 1.6875, 0.6875)
    # k = max(1, ⌊4·0.25⌋) = 1 -> token 2 gets + 0.1·|0.3|.
    # token-sum = −e^0.1 + e^−0.2 − 2e^0.3 − 0 + 0.03
    logp = [-1.0, -2.0, -0.5, -3.0]
    delta = [0.1, -0.2, 0.3, 0.0]
    old, new, adv, mask = rows([[p - d for p, d in zip(logp, delta)]], [logp], [[1, -1, 2, 0]])
    loss, metrics = algorithms.get_loss("kl_cov")(
        old, new, adv, mask, loss_agg_mode="token-sum", kl_cov_ratio=0.25, ppo_kl_coef=0.1
    )
    expected = -math.exp(0.1) + math.exp(-0.2) - 2 * math.exp(0.3) + 0.1 * 0.3
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    # gradient: −A·r everywhere, plus 0.1·sign(Δ) on the penalised token.
    grad = [-math.exp(0.1), math.exp(-0.2), -2 * math.exp(0.3) + 0.1, 0.0]
    torch.testing.assert_close(grad_of(loss, new), torch.tensor([grad], dtype=torch.float64))
    assert metrics["kl_cov_frac"].item() == pytest.approx(0.25)
    assert metrics["pg_clipfrac"].item() == 0.0


def test_kl_cov_breaks_covariance_ties_towards_the_earlier_token():
    # A = (1, −1), log π = (−1, −3): Ā = 0, mean log π = −2, cov = (1·1, −1·−1) = (1, 1).
    # k = max(1, ⌊2·0.25⌋) = 1: the tie goes to token 0, whose |Δ| = 0.5 is penalised.
    old, new, adv, mask = rows([[-1.5, -3.25]], [[-1.0, -3.0]], [[1.0, -1.0]])
    loss, _ = algorithms.get_loss("kl_cov")(
        old, new, adv, mask, loss_agg_mode="token-sum", kl_cov_ratio=0.25, ppo_kl_coef=1.0
    )
    # −1·e^0.5 + 1·0.5 − (−1)·e^0.25
    assert loss.item() == pytest.approx(-math.exp(0.5) + 0.5 + math.exp(0.25), rel=1e-12)


@pytest.mark.parametrize("ratio", [0.0, 1.5, -0.1])
def test_kl_cov_ratio_must_be_a_fraction(ratio):
    b = random_batch(0, 2, 3)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        algorithms.get_loss("kl_cov")(b["old"], b["new"], b["adv"], b["mask"], kl_cov_ratio=ratio)


# -- clip_cov --------------------------------------------------------------------------------
CLIP_COV = {"clip_cov_ratio": 0.2, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}


def clip_cov_run(b, seed):
    gen = torch.Generator().manual_seed(seed)
    loss, metrics = algorithms.get_loss("clip_cov")(
        b["old"],
        b["new"],
        b["adv"],
        b["mask"],
        generator=gen,
        loss_agg_mode="token-sum",
        **CLIP_COV,
    )
    return loss, grad_of(loss, b["new"]), metrics


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_clip_cov_with_the_same_seed_is_reproducible(data_seed, seed):
    b = random_batch(data_seed, 4, 8, spread=0.05)
    loss1, grad1, m1 = clip_cov_run(b, seed)
    loss2, grad2, m2 = clip_cov_run(b, seed)
    assert loss1.item() == loss2.item()
    assert torch.equal(grad1, grad2)
    assert m1["clip_cov_frac"].item() == m2["clip_cov_frac"].item()


def test_clip_cov_seeds_choose_different_tokens_and_zero_their_gradient():
    # 32 valid, unclipped tokens (spread 0 -> r = 1) with distinct A: k = ⌊32·0.2⌋ = 6 zeroed.
    b = random_batch(1, 4, 8, spread=0.0, keep=1.0)
    b["adv"] = torch.linspace(-2, 2, 32, dtype=torch.float64).view(4, 8)
    zeroed = []
    for seed in range(4):
        _, grad, metrics = clip_cov_run(b, seed)
        assert metrics["clip_cov_frac"].item() == pytest.approx(6 / 32)
        # r = 1: the surrogate's gradient is −A ≠ 0 except on the zeroed tokens.
        zeroed.append(frozenset(torch.nonzero(grad.flatten() == 0).flatten().tolist()))
    assert all(len(z) == 6 for z in zeroed)
    assert len(set(zeroed)) > 1


def test_clip_cov_bounds_must_be_ordered():
    b = random_batch(0, 2, 3)
    with pytest.raises(ValueError, match="clip_cov_lb < clip_cov_ub"):
        algorithms.get_loss("clip_cov")(
            b["old"], b["new"], b["adv"], b["mask"], clip_cov_lb=5.0, clip_cov_ub=1.0
        )


# -- cispo -------------------------------------------------------------------------------------
def cispo_row(r, a=1.0, logp=-1.2):
    return rows([[logp - math.log(r)]], [[logp]], [[a]])


@pytest.mark.parametrize(
    "r, variant, weight",
    [
        (1.5, "verl", 1.2),  # clip(1.5, 0.8, 1.2) = 1.2
        (0.5, "verl", 0.8),  # clip(0.5, 0.8, 1.2) = 0.8
        (1.1, "verl", 1.1),  # inside the band
        (1.5, "trl", 1.5),  # min(1.5, 5) = 1.5: TRL has no band, only the cap
        (0.5, "trl", 0.5),  # no lower bound in TRL
        (10.0, "trl", 5.0),  # min(10, 5) = 5
    ],
)
def test_cispo_weights_the_log_prob_by_a_clipped_detached_ratio(r, variant, weight):
    # L = −sg(w)·A·log π with log π = −1.2, A = 1: L = 1.2·w; dL/dlog π = −w.
    old, new, adv, mask = cispo_row(r)
    loss, _ = algorithms.get_loss("cispo")(old, new, adv, mask, cispo_variant=variant)
    assert loss.item() == pytest.approx(1.2 * weight, rel=1e-12)
    assert grad_of(loss, new).item() == pytest.approx(-weight, rel=1e-12)


def test_cispo_rejects_a_trl_cap_with_the_verl_variant_and_unknown_variants():
    old, new, adv, mask = cispo_row(1.0)
    cispo = algorithms.get_loss("cispo")
    with pytest.raises(ValueError, match="cispo_max_weight"):
        cispo(old, new, adv, mask, cispo_max_weight=5.0)
    with pytest.raises(ValueError, match="cispo_variant"):
        cispo(old, new, adv, mask, cispo_variant="minimax")


# -- gpg -----------------------------------------------------------------------------------------
def test_gpg_is_minus_advantage_times_log_prob():
    # L = −A·log π = −(2·−0.5) − (−1·−2) = 1 − 2 = −1 (token-sum); dL/dlog π = −A.
    old, new, adv, mask = rows([[0.0, 0.0]], [[-0.5, -2.0]], [[2.0, -1.0]])
    loss, metrics = algorithms.get_loss("gpg")(old, new, adv, mask, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(grad_of(loss, new), torch.tensor([[-2.0, 1.0]], dtype=torch.float64))
    assert metrics["ppo_kl"].item() == pytest.approx(1.25)  # mean(0.5, 2)


# -- sapo ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, tau", [(1.5, 1.0), (-2.0, 1.05)])
def test_sapo_on_policy_value_is_two_over_tau_and_gradient_is_ppos(a, tau):
    # r = 1: gate = sigmoid(0)·4/τ = 2/τ, L = −A·2/τ;
    # dL/dlog π = −A·sigmoid'(0)·τ·r·4/τ = −A·¼·4 = −A (PPO's on-policy gradient).
    old, new, adv, mask = rows([[-1.0]], [[-1.0]], [[a]])
    loss, metrics = algorithms.get_loss("sapo")(old, new, adv, mask)
    assert loss.item() == pytest.approx(-a * 2 / tau, rel=1e-12)
    assert grad_of(loss, new).item() == pytest.approx(-a, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.0


@pytest.mark.parametrize("key", ["tau_pos", "tau_neg"])
def test_sapo_temperatures_must_be_positive(key):
    old, new, adv, mask = rows([[-1.0]], [[-1.0]], [[1.0]])
    with pytest.raises(ValueError, match=key):
        algorithms.get_loss("sapo")(old, new, adv, mask, **{key: 0.0})


# -- geo_mean --------------------------------------------------------------------------------------
EPS = 1e-8  # verl's guard in GMPO's sequence means: Σ_t x_t / (n + 1e-8)


def test_geo_mean_clips_in_log_space_on_the_advantage_side():
    # Δ = (0.1, 0.5), ε = 0.2. A = 1: Δ* = min(Δ, 0.2) = (0.1, 0.2)
    #   R = exp(0.3/(2 + ε')), Ā = 2/(2 + ε') (ε' = 1e-8), L = −Ā·R ≈ −e^0.15.
    # dL/dΔ_1 = −Ā·R/(2 + ε') ≈ −e^0.15/2; Δ_2 is clipped -> 0.
    # Δ_2 lies outside [−0.2, 0.2] with A > 0: pg_clipfrac = 1/2.
    old, new, adv, mask = rows([[0.0, 0.0]], [[0.1, 0.5]], [[1.0, 1.0]])
    geo = algorithms.get_loss("geo_mean")
    loss, metrics = geo(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean")
    ratio, mean_adv = math.exp(0.3 / (2 + EPS)), 2 / (2 + EPS)
    assert loss.item() == pytest.approx(-mean_adv * ratio, rel=1e-12)
    expected = torch.tensor([[-mean_adv * ratio / (2 + EPS), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad_of(loss, new), expected)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)
    # A = −1: Δ* = max(Δ, −0.2) = Δ -> L = Ā·exp(0.6/(2 + ε')) ≈ e^0.3;
    # Δ_2 counts in pg_clipfrac_lower (verl's metric: outside the band, A < 0).
    old, new, adv, mask = rows([[0.0, 0.0]], [[0.1, 0.5]], [[-1.0, -1.0]])
    loss, metrics = geo(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx(mean_adv * math.exp(0.6 / (2 + EPS)), rel=1e-12)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(0.5)


def test_geo_mean_token_mean_weights_rows_by_length():
    # rows of 1 and 3 tokens, on-policy, A = 1 and 2: L_b = −n_b·A_b/(n_b + ε') (R = 1).
    # token-mean = (1·L_0 + 3·L_1)/4 ≈ (−1 − 6)/4 = −1.75;
    # seq-mean-token-mean = (L_0 + L_1)/2 ≈ (−1 − 2)/2 = −1.5
    old, new, adv, mask = rows(
        [[0.0] * 3] * 2, [[0.0] * 3] * 2, [[1.0] * 3, [2.0] * 3], [[True, False, False], [True] * 3]
    )
    seq_loss = [-1 / (1 + EPS), -6 / (3 + EPS)]
    geo = algorithms.get_loss("geo_mean")
    token_mean = geo(old, new, adv, mask)[0]
    assert token_mean.item() == pytest.approx((seq_loss[0] + 3 * seq_loss[1]) / 4, rel=1e-12)
    seq = geo(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean")[0]
    assert seq.item() == pytest.approx(sum(seq_loss) / 2, rel=1e-12)
