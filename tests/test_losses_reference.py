"""Every policy loss equals its straightforward loop reference (value, gradient, metrics).

float64: relative error <= 1e-9; float32 against the float64 reference: <= 1e-5.
"""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import algorithms
from algorithms.reference import policy_loss_loops as loops
from algorithms.reference.policy_loss_inputs import random_batch
from rlkit.registry import AGGREGATIONS

MODES = AGGREGATIONS.names()
LOSSES = ["vanilla", "gspo", "kl_cov", "clip_cov", "cispo", "gpg", "sapo", "geo_mean"]

# Generous selection knobs so that kl_cov / clip_cov act on a handful of tokens.
KL_COV = {"kl_cov_ratio": 0.3, "ppo_kl_coef": 0.7}
CLIP_COV = {"clip_cov_ratio": 0.3, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}


def run_rlkit(name, b, mode, low, high, c, is_w, seed):
    options = {}
    if name == "kl_cov":
        options = dict(KL_COV)
    if name == "clip_cov":
        options = dict(CLIP_COV, generator=torch.Generator().manual_seed(seed))
    fn = algorithms.get_loss(name)
    loss, metrics = fn(
        b["old"],
        b["new"],
        b["adv"],
        b["mask"],
        loss_agg_mode=mode,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        rollout_is_weights=is_w,
        **options,
    )
    (grad,) = torch.autograd.grad(loss, b["new"], allow_unused=True)
    return loss, grad, metrics


def run_loop(name, b, mode, low, high, c, is_w, seed):
    old, new, adv, mask = b["old"], b["new"], b["adv"], b["mask"]
    args = (old, new, adv, mask)
    if name == "vanilla":
        loss, metrics = loops.vanilla(*args, mode=mode, low=low, high=high, c=c, is_w=is_w)
    elif name == "gspo":
        loss, metrics = loops.gspo(*args, mode=mode, low=low, high=high, is_w=is_w)
    elif name == "kl_cov":
        loss, metrics = loops.kl_cov(*args, mode=mode, ratio=0.3, coef=0.7, is_w=is_w)
    elif name == "clip_cov":
        gen = torch.Generator().manual_seed(seed)
        loss, metrics = loops.clip_cov(
            *args, gen, mode=mode, low=low, high=high, ratio=0.3, lb=-100.0, ub=100.0, is_w=is_w
        )
    elif name == "cispo":
        loss, metrics = loops.cispo(*args, mode=mode, low=low, high=high, is_w=is_w)
    elif name == "gpg":
        loss, metrics = loops.gpg(*args, mode=mode, is_w=is_w)
    elif name == "sapo":
        loss, metrics = loops.sapo(*args, mode=mode, is_w=is_w)
    else:
        loss, metrics = loops.geo_mean(*args, mode=mode, low=low, high=high, is_w=is_w)
    grad = torch.autograd.grad(loss, new, allow_unused=True)[0] if loss.requires_grad else None
    return loss, grad, metrics


def as_float64(b):
    out = {k: v.detach().to(torch.float64) if v.is_floating_point() else v for k, v in b.items()}
    out["new"].requires_grad_()
    return out


def zeros_if_none(grad, like):
    return torch.zeros_like(like) if grad is None else grad


case = st.fixed_dictionaries(
    {
        "name": st.sampled_from(LOSSES),
        "mode": st.sampled_from(MODES),
        "seed": st.integers(0, 10_000),
        "batch": st.integers(0, 4),
        "length": st.integers(1, 6),
        "spread": st.sampled_from([0.0, 0.05, 0.3, 1.5]),
        "empty_rows": st.integers(0, 2),
        "low": st.sampled_from([0.1, 0.2, 0.28]),
        "high": st.sampled_from([0.2, 0.28, 0.5]),
        "c": st.sampled_from([1.5, 3.0]),
        "weighted": st.booleans(),
    }
)


def inputs(case, dtype):
    b = random_batch(
        case["seed"],
        case["batch"],
        case["length"],
        dtype=dtype,
        spread=case["spread"],
        empty_rows=case["empty_rows"],
    )
    is_w = None
    if case["weighted"]:
        gen = torch.Generator().manual_seed(case["seed"] + 1)
        is_w = torch.rand(case["batch"], case["length"], generator=gen, dtype=torch.float64)
        is_w = (0.5 + is_w).to(dtype)
    return b, is_w


@settings(max_examples=80, deadline=None)
@given(case)
def test_each_loss_matches_its_loop_reference_in_float64(case):
    b, is_w = inputs(case, torch.float64)
    if case["name"] == "kl_cov":
        assume(well_separated_top_k(b, 1e-12))
    args = (case["name"], b, case["mode"], case["low"], case["high"], case["c"], is_w, case["seed"])
    loss, grad, metrics = run_rlkit(*args)
    ref_loss, ref_grad, ref_metrics = run_loop(*args)
    torch.testing.assert_close(loss, ref_loss.to(loss.dtype), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(
        zeros_if_none(grad, b["new"]), zeros_if_none(ref_grad, b["new"]), rtol=1e-9, atol=1e-12
    )
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "kl_cov_frac"):
        if key in ref_metrics:
            assert float(metrics[key]) == pytest.approx(ref_metrics[key], rel=1e-9, abs=1e-12)


def well_separated_top_k(b, tolerance, ratio=0.3):
    """kl_cov's choice is ill-conditioned when the k-th and (k+1)-th covariances
    nearly tie (two valid tokens tie mathematically): rounding in a different
    order may then pick different tokens, both correctly."""
    cov = sorted(loops.covariances(b["adv"], b["new"].detach(), b["mask"]).values(), reverse=True)
    k = max(1, int(len(cov) * ratio))
    return len(cov) <= k or cov[k - 1] - cov[k] > tolerance * max(1.0, abs(cov[k]))


@settings(max_examples=40, deadline=None)
@given(case)
def test_float32_losses_match_the_float64_reference_within_1e_5(case):
    b32, is_w = inputs(case, torch.float32)
    if case["name"] == "kl_cov":
        assume(well_separated_top_k(as_float64(b32), 1e-4))
    args = (case["mode"], case["low"], case["high"], case["c"])
    loss, grad, _ = run_rlkit(case["name"], b32, *args, is_w, case["seed"])
    w64 = None if is_w is None else is_w.to(torch.float64)
    b64 = as_float64(b32)
    ref_loss, ref_grad, _ = run_loop(case["name"], b64, *args, w64, case["seed"])
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        zeros_if_none(grad, b32["new"]).double(),
        zeros_if_none(ref_grad, b64["new"]),
        rtol=1e-5,
        atol=1e-6,
    )


def test_cispo_trl_variant_matches_its_loop_reference():
    b = random_batch(3, 4, 6, spread=1.0)
    loss, _ = algorithms.get_loss("cispo")(
        b["old"], b["new"], b["adv"], b["mask"], cispo_variant="trl", cispo_max_weight=1.3
    )
    ref, _ = loops.cispo(b["old"], b["new"], b["adv"], b["mask"], variant="trl", cap=1.3)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)


def test_sapo_temperatures_match_the_loop_reference():
    b = random_batch(5, 3, 5, spread=0.8)
    loss, _ = algorithms.get_loss("sapo")(
        b["old"], b["new"], b["adv"], b["mask"], tau_pos=0.7, tau_neg=2.0
    )
    ref, _ = loops.sapo(b["old"], b["new"], b["adv"], b["mask"], tau_pos=0.7, tau_neg=2.0)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
