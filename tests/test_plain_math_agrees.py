"""The plain math and the fused math beside it give the same values and gradients.

Every policy loss and estimator that keeps a fused path (``algorithms.math_mode.
FUSED_PATHS``, ``estimators.math_mode.FUSED_PATHS``) is run both ways on random inputs
(ragged masks, interior mask-0 spans, empty rows, garbage and -inf log-probs at
padding) in float32 and float64, and compared within tolerances derived from the
arithmetic (the Higham bound of ``tests/numerics.py``: a computation whose longest
chain of rounded operations has length D is off by at most gamma_D = D u / (1 - D u)
relative to the sum of the absolute values of its terms, u = 2^-24 in float32 and
2^-53 in float64, so two such computations differ by at most 2 gamma_D of it).

**Losses.** Per token, both maths apply the same elementwise operations (the plain
one: where, clamp, exp, products, maximum/minimum; the fused one forms the same
products inside one autograd node), and clamp, where, maximum, minimum, negation
and products by 0 or ±1 are exact. So a token's loss, and its gradient factor (the
upstream gradient times −A·r, or 1 for GMPO's clip), passes through at most
``TOKEN_OPS`` = 8 rounded operations on either side (exp counted twice: it is
within one ulp): they differ by at most 2 gamma_8 of their own size, elementwise.
The scalar loss is then a masked sum of n <= B·T + B such terms with non-negative
weights: it differs by at most 2 gamma_(n + 8) times S = max |token loss| x the
aggregation of a loss of 1 everywhere (an upper bound of the sum of absolute terms).
The gradient with respect to log pi is per token (the aggregation's backward depends
only on the mask, the normalisers and the IS weights, the same on both sides): rtol
2 gamma_8. Metrics are masked means of the same per-token flags and log-ratios: the
scalar bound with S = max(1, max |log-ratio|).

**Estimators.** GAE and the discounted returns are sums y_t = sum_k d^k x_(t+k) over
the valid tokens after t. The plain loop rounds twice per step and carries d rounded
to the dtype (k more roundings for d^k); the fused scan rounds once per decay power
and once per term of two matmuls (chunk C and chunk count N, C + N <= T) plus an
addcmul. With GAE's delta_t = r_t + gamma V_t' - V_t (three roundings) every term
passes through at most D = 3T + 9 rounded operations on either side, so
|plain - fused| <= 2 gamma_D S_t, S_t = sum_k d^k (|r| + |V| + gamma |V'|)_(t+k),
which is the same recurrence on absolute values (computed in float64 by the plain
loop with rewards |r| + 2|V| and values |V|). A return A + V or G - b adds one
rounding (2 gamma_(D+1) (S_t + |V_t|), resp. + |b|). Whitening runs the same code
after either path, so the comparison is on the unwhitened outputs (GAE with
``whiten=False`` and its returns, REINFORCE++'s returns, ReMax's outputs).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms
import estimators
from algorithms import math_mode as loss_math
from algorithms.aggregation import aggregate_loss, aggregate_sequence_loss
from algorithms.losses.fused import gspo_terms_fused, sign_aware_clip_fused, vanilla_terms_fused
from algorithms.losses.geo_mean import sign_aware_clip
from algorithms.losses.gspo import gspo_terms
from algorithms.losses.vanilla import vanilla_terms
from estimators import math_mode as estimator_math
from estimators.discounted_returns import discounted_returns, discounted_returns_fused
from estimators.gae import gae_advantages, gae_advantages_fused
from rlkit.registry import ESTIMATORS
from rlkit.testing import strategies as S
from tests.numerics import gamma

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (torch.float32, torch.float64)
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
#: Rounded operations between the inputs and one token's loss or gradient factor (above).
TOKEN_OPS = 8
MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOSS_OPTIONS = {"clip_cov": {"clip_cov_ratio": 0.3, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}}


def two_gamma(depth: int, dtype: torch.dtype) -> float:
    """2 gamma_depth in ``dtype``: the largest relative difference of two such computations."""
    return 2 * gamma(depth, UNIT_ROUNDOFF[dtype])


# -- inputs ------------------------------------------------------------------------------
def ragged_mask(gen: torch.Generator, rows: int, length: int, kind: str) -> torch.Tensor:
    """(rows, length) bool: right padding, or interior mask-0 spans; row 0 always empty."""
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    if kind == "holes":
        mask &= torch.rand(rows, length, generator=gen) < 0.7
    mask[0] = False
    return mask


def loss_inputs(seed: int, dtype: torch.dtype, kind: str = "holes") -> dict[str, torch.Tensor]:
    """Random loss inputs: ratios often outside the clip band, -inf log-probs at padding."""
    gen = torch.Generator().manual_seed(seed)
    rows, length = 7, 23
    mask = ragged_mask(gen, rows, length, kind)
    old = torch.rand(rows, length, generator=gen, dtype=torch.float64) * -4.0
    new = old + 0.6 * torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv[1] = 0.0  # a zero-advantage row: ties everywhere between the two surrogates
    is_w = torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2.0
    old, new = old.masked_fill(~mask, -math.inf), new.masked_fill(~mask, -math.inf)
    tensors = {"old": old, "new": new, "adv": adv, "is_w": is_w}
    return {**{k: v.to(dtype) for k, v in tensors.items()}, "mask": mask}


# -- the losses' cores, token by token -------------------------------------------------------
def assert_per_token_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Elementwise within 2 gamma_TOKEN_OPS of the element itself (tiny: subnormals)."""
    rtol = two_gamma(TOKEN_OPS, dtype)
    torch.testing.assert_close(got, want, rtol=rtol, atol=torch.finfo(dtype).tiny)


def core_pair(name: str, x: dict[str, torch.Tensor]):
    """(plain, fused) outputs of a core on ``x``, each with the gradient of a random
    upstream gradient with respect to its differentiable input."""
    valid = x["mask"]
    weights = valid.to(x["old"].dtype)
    upstream = torch.randn(valid.shape, generator=torch.Generator().manual_seed(7))
    outputs = []
    for core in CORES[name]:
        new = x["new"].clone().requires_grad_()
        if name == "sign_aware_clip":
            delta = torch.where(valid, new - x["old"], 0.0)
            kept, *flags = core(delta, x["adv"], low=0.2, high=0.28)
            loss = kept
        elif name == "gspo_terms":
            terms = core(x["old"], new, x["adv"], valid, weights, low=0.2, high=0.28)
            loss, flags = terms.loss, [terms.clipped, terms.clipped_lower, terms.log_ratio]
        else:
            c = 3.0 if name == "vanilla_terms" else None
            terms = core(x["old"], new, x["adv"], valid, low=0.2, high=0.28, clip_ratio_c=c)
            loss, flags = terms.loss, [terms.clipped, terms.clipped_lower, terms.log_ratio]
        (grad,) = torch.autograd.grad((loss * upstream.to(loss.dtype)).sum(), new)
        outputs.append((loss.detach(), flags, grad))
    return outputs


CORES = {
    "vanilla_terms": (vanilla_terms, vanilla_terms_fused),
    "vanilla_terms_no_dual_clip": (vanilla_terms, vanilla_terms_fused),
    "gspo_terms": (gspo_terms, gspo_terms_fused),
    "sign_aware_clip": (sign_aware_clip, sign_aware_clip_fused),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CORES))
@pytest.mark.parametrize("seed", [0, 1])
def test_each_fused_core_matches_its_plain_core_token_by_token(name, dtype, seed):
    x = loss_inputs(seed, dtype)
    (plain, plain_flags, plain_grad), (fused, fused_flags, fused_grad) = core_pair(name, x)
    assert_per_token_close(fused, plain, dtype)
    for got, want in zip(fused_flags, plain_flags):
        if want is None or want.dtype == torch.bool:
            assert (got is None and want is None) or torch.equal(got, want)
        else:
            assert_per_token_close(got, want, dtype)
    assert_per_token_close(fused_grad, plain_grad, dtype)
    assert torch.isfinite(plain_grad).all() and (plain_grad[~x["mask"]] == 0).all()


# -- the registered losses, both ways -------------------------------------------------------
def run_loss(name: str, x: dict[str, torch.Tensor], mode: str, agg: str, with_is: bool):
    """(loss, metrics, d loss / d log pi) of the registered loss under ``mode``'s math."""
    new = x["new"].clone().requires_grad_()
    options = dict(LOSS_OPTIONS.get(name, {}))
    if name == "clip_cov":
        options["generator"] = torch.Generator().manual_seed(3)
    is_w = x["is_w"] if with_is else None
    with loss_math.use_math(mode):
        loss, metrics = algorithms.get_loss(name)(
            x["old"],
            new,
            x["adv"],
            x["mask"],
            loss_agg_mode=agg,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            rollout_is_weights=is_w,
            **options,
        )
    (grad,) = torch.autograd.grad(loss, new)
    return loss.detach(), {k: v.detach() for k, v in metrics.items()}, grad


def largest_token_loss(name: str, x: dict[str, torch.Tensor], with_is: bool) -> float:
    """max |per-token loss| (GMPO: max |per-sequence loss|) bounded from the plain cores."""
    mask = x["mask"]
    weights = mask.to(x["old"].dtype)
    scale = x["is_w"].abs().max().item() if with_is else 1.0
    if name == "geo_mean":
        # |L_b| = |mean A| exp(mean Δ*) W_b <= max |A| exp(max Δ*) max W.
        delta = torch.where(mask, x["new"] - x["old"], 0.0)
        kept, *_ = sign_aware_clip(delta, x["adv"], low=0.2, high=0.28)
        return x["adv"].abs().max().item() * math.exp(kept.max().item()) * (scale + 1e-10)
    if name == "gspo":
        terms = gspo_terms(x["old"], x["new"], x["adv"], mask, weights, low=0.2, high=0.28)
    else:
        dual = 3.0 if name == "vanilla" else None
        terms = vanilla_terms(
            x["old"], x["new"], x["adv"], mask, low=0.2, high=0.28, clip_ratio_c=dual
        )
    return terms.loss.detach().abs().max().item() * scale


def unit_aggregate(name: str, mask: torch.Tensor, agg: str, dtype: torch.dtype) -> float:
    """The aggregation of a loss of 1 on every token (per sequence for GMPO)."""
    if name == "geo_mean":
        return aggregate_sequence_loss(torch.ones(mask.shape[0], dtype=dtype), mask, agg).item()
    return aggregate_loss(torch.ones(mask.shape, dtype=dtype), mask, agg).item()


def assert_loss_agrees(name: str, x: dict[str, torch.Tensor], agg: str, with_is: bool) -> None:
    """Plain and fused: scalar loss, metrics and gradient within the derived bounds."""
    dtype = x["old"].dtype
    plain = run_loss(name, x, "plain", agg, with_is)
    fused = run_loss(name, x, "fused", agg, with_is)
    depth = x["mask"].numel() + x["mask"].shape[0] + TOKEN_OPS
    tol = two_gamma(depth, dtype)
    scale = largest_token_loss(name, x, with_is) * unit_aggregate(name, x["mask"], agg, dtype)
    torch.testing.assert_close(fused[0], plain[0], rtol=0.0, atol=tol * scale + 1e-300)
    delta = torch.where(x["mask"], x["new"] - x["old"], 0.0)
    metric_scale = max(1.0, delta.abs().max().item())
    assert fused[1].keys() == plain[1].keys()
    for key in plain[1]:
        torch.testing.assert_close(fused[1][key], plain[1][key], rtol=0.0, atol=tol * metric_scale)
    assert_per_token_close(fused[2], plain[2], dtype)
    assert torch.isfinite(plain[2]).all() and (plain[2][~x["mask"]] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", loss_math.FUSED_PATHS)
def test_each_loss_gives_the_same_loss_metrics_and_gradient_both_ways(name, dtype):
    for seed, (agg, with_is) in enumerate(zip(MODES, (False, True, True, False))):
        assert_loss_agrees(
            name, loss_inputs(seed, dtype, ("holes", "right")[seed % 2]), agg, with_is
        )


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(loss_math.FUSED_PATHS), dtype=st.sampled_from(DTYPES))
def test_property_plain_and_fused_losses_agree_on_drawn_inputs(data, name, dtype):
    mask = data.draw(S.response_masks(max_rows=5, max_len=9))
    old, new = data.draw(S.log_prob_pairs(mask, dtype=dtype))
    adv = data.draw(S.advantages(mask, dtype=dtype))
    is_w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    x = {"old": old, "new": new, "adv": adv, "mask": mask, "is_w": is_w}
    assert_loss_agrees(name, x, data.draw(st.sampled_from(MODES)), data.draw(st.booleans()))


# -- the estimators, both ways -------------------------------------------------------------
def scan_inputs(seed: int, dtype: torch.dtype, rows: int, length: int, kind: str):
    """Rewards (0 on mask-0 tokens), critic values, baselines and a ragged bool mask."""
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, rows, length, kind)
    rewards = torch.randn(rows, length, generator=gen, dtype=torch.float64) * mask
    values = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    baselines = torch.randn(rows, generator=gen, dtype=torch.float64)
    return rewards.to(dtype), values.to(dtype), baselines.to(dtype), mask


def scan_depth(length: int) -> int:
    """D = 3T + 9: the longest chain of rounded operations of either scan (module docstring)."""
    return 3 * length + 9


def gae_scale(rewards, values, mask, gamma_, lam) -> torch.Tensor:
    """S_t = sum_k (gamma lam)^k (|r| + |V| + gamma |V'|)_(t+k), by the plain loop in float64."""
    r, v = rewards.double().abs(), values.double().abs()
    return gae_advantages(r + 2 * v, v, mask, gamma=gamma_, lam=lam)


def assert_within(got, want, bound) -> None:
    difference = (got.double() - want.double()).abs()
    excess = difference - bound
    assert (excess <= 0).all(), f"largest excess over the bound: {excess.max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["right", "holes"])
@pytest.mark.parametrize(("gamma_", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_loop_and_scan_agree(dtype, kind, gamma_, lam):
    rewards, values, _, mask = scan_inputs(0, dtype, rows=6, length=300, kind=kind)
    plain = gae_advantages(rewards, values, mask, gamma=gamma_, lam=lam)
    fused = gae_advantages_fused(rewards, values, mask, gamma=gamma_, lam=lam)
    bound = two_gamma(scan_depth(mask.shape[1]), dtype) * gae_scale(
        rewards, values, mask, gamma_, lam
    )
    assert_within(fused, plain, bound)
    assert (plain[~mask] == 0).all() and (fused[~mask] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["right", "holes"])
@pytest.mark.parametrize("gamma_", [1.0, 0.99, 0.5])
def test_discounted_returns_loop_and_scan_agree(dtype, kind, gamma_):
    rewards, _, _, mask = scan_inputs(1, dtype, rows=6, length=300, kind=kind)
    plain = discounted_returns(rewards, mask, gamma=gamma_)
    fused = discounted_returns_fused(rewards, mask, gamma=gamma_)
    scale = discounted_returns(rewards.double().abs(), mask, gamma=gamma_)
    assert_within(fused, plain, two_gamma(scan_depth(mask.shape[1]), dtype) * scale)
    assert (plain[~mask] == 0).all() and (fused[~mask] == 0).all()


def run_estimator(name: str, inputs: dict, mode: str):
    options = {"whiten": False} if name == "gae" else {}
    with estimator_math.use_math(mode):
        return estimators.get(name)(**inputs, **options)


def assert_estimator_agrees(name: str, inputs: dict) -> None:
    """Plain and fused: the unwhitened outputs within the derived bounds."""
    dtype = inputs["token_level_rewards"].dtype
    mask = inputs["response_mask"].bool()
    plain = run_estimator(name, inputs, "plain")
    fused = run_estimator(name, inputs, "fused")
    tol = two_gamma(scan_depth(mask.shape[1]) + 1, dtype)
    rewards, g, lam = inputs["token_level_rewards"], inputs["gamma"], inputs["lam"]
    if name == "gae":
        scale = gae_scale(rewards, inputs["values"], mask, g, lam)
        extra = [0.0, inputs["values"].double().abs()]  # returns = A + V
    else:
        scale = discounted_returns(rewards.double().abs(), mask, gamma=g)
        baseline = inputs["reward_baselines"].double().abs()[:, None]
        extra = [baseline if name == "remax" else 0.0, 0.0]
    if name == "reinforce_plus_plus":  # its advantages are whitened returns: shared code
        plain, fused, extra = plain[1:], fused[1:], extra[1:]
    for got, want, more in zip(fused, plain, extra):
        assert got.dtype == dtype
        assert_within(got, want, tol * (scale + more))
        assert (want[~mask] == 0).all() and (got[~mask] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", estimator_math.FUSED_PATHS)
def test_each_estimator_gives_the_same_outputs_both_ways(name, dtype):
    for seed, kind in enumerate(("right", "holes")):
        rewards, values, baselines, mask = scan_inputs(seed, dtype, 5, 97, kind)
        inputs = {
            "token_level_rewards": rewards,
            "response_mask": mask,
            "values": values,
            "reward_baselines": baselines,
            "gamma": 0.97,
            "lam": 0.9,
        }
        assert_estimator_agrees(name, inputs)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(estimator_math.FUSED_PATHS),
    inputs=S.estimator_inputs(
        max_rows=5, max_len=70, mask_dtypes=(torch.bool, torch.float64), dtype=torch.float32
    ),
)
def test_property_plain_and_fused_estimators_agree_on_drawn_inputs(name, inputs):
    assert_estimator_agrees(name, inputs)


# -- the switch ----------------------------------------------------------------------------
def python_files_called(fn) -> set[str]:
    """The source files of every Python function that runs during ``fn()``."""
    files: set[str] = set()

    def profile(frame, event, _arg):
        if event == "call":
            files.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files


LOSS_FUSED_FILES = {str(ROOT / "algorithms" / "losses" / "fused.py")}
ESTIMATOR_FUSED_FILES = {
    str(ROOT / "estimators" / "discounted_scan.py"),
    str(ROOT / "estimators" / "valid_token_compaction.py"),
}


@pytest.mark.parametrize("name", algorithms.loss_names())
def test_fused_code_runs_only_for_the_listed_losses_and_never_under_plain_math(name):
    x = loss_inputs(0, torch.float32)

    def call(mode: str) -> set[str]:
        return python_files_called(lambda: run_loss(name, x, mode, "token-mean", False))

    assert bool(call("fused") & LOSS_FUSED_FILES) == (name in loss_math.FUSED_PATHS)
    assert not call("plain") & LOSS_FUSED_FILES


@pytest.mark.parametrize("name", estimators.names())
def test_fused_scans_run_only_for_the_listed_estimators_and_never_under_plain_math(name):
    rewards, values, baselines, mask = scan_inputs(0, torch.float32, 6, 40, "holes")
    inputs = {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": torch.arange(6) // 2,
        "values": values,
        "reward_baselines": baselines,
        "gamma": 0.9,
    }
    inputs |= {key: rewards for key in ESTIMATORS.entry(name).extra.get("inputs", ())}

    def call(mode: str) -> set[str]:
        with estimator_math.use_math(mode):
            return python_files_called(lambda: estimators.get(name)(**inputs))

    assert bool(call("fused") & ESTIMATOR_FUSED_FILES) == (name in estimator_math.FUSED_PATHS)
    assert not call("plain") & ESTIMATOR_FUSED_FILES


@pytest.mark.parametrize("package", [algorithms, estimators])
def test_the_switch_defaults_to_fused_validates_and_restores(package):
    assert package.get_math() == "fused"
    with package.plain_math():
        assert package.get_math() == "plain"
    assert package.get_math() == "fused"
    with pytest.raises(RuntimeError), package.plain_math():
        raise RuntimeError("the previous mode comes back even on error")
    assert package.get_math() == "fused"
    package.set_math("plain")
    try:
        assert package.get_math() == "plain"
    finally:
        package.set_math("fused")
    with pytest.raises(ValueError, match="plain"):
        package.set_math("fast")


def test_the_two_switches_are_independent():
    with algorithms.plain_math():
        assert estimators.get_math() == "fused"
    with estimators.plain_math():
        assert algorithms.get_math() == "fused"


def test_plain_math_reaches_a_loss_the_caller_looked_up_before():
    # The trainer resolves its loss once; the mode is read on every call.
    loss_fn = algorithms.get_loss("vanilla")
    x = loss_inputs(2, torch.float64)
    with algorithms.plain_math():
        files = python_files_called(lambda: loss_fn(x["old"], x["new"], x["adv"], x["mask"]))
    assert not files & LOSS_FUSED_FILES
