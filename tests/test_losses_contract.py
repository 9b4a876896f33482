"""The contract every registered policy loss keeps: signature, options, metrics, degenerate input."""

import inspect
import math

import pytest
import torch

import algorithms
from algorithms.reference.policy_loss_inputs import random_batch
from rlkit.registry import AGGREGATIONS, POLICY_LOSSES, UnknownNameError

LOSSES = algorithms.loss_names()
MODES = AGGREGATIONS.names()
SHARED = [
    ("old_log_prob", inspect.Parameter.empty),
    ("log_prob", inspect.Parameter.empty),
    ("advantages", inspect.Parameter.empty),
    ("response_mask", inspect.Parameter.empty),
    ("loss_agg_mode", "token-mean"),
    ("clip_ratio", 0.2),
    ("clip_ratio_low", None),
    ("clip_ratio_high", None),
    ("clip_ratio_c", 3.0),
    ("rollout_is_weights", None),
    ("num_tokens", None),
    ("num_seqs", None),
    ("norm_length", None),
]


def call(name, b, **kw):
    if name == "clip_cov":
        kw.setdefault("generator", torch.Generator().manual_seed(0))
    return algorithms.get_loss(name)(b["old"], b["new"], b["adv"], b["mask"], **kw)


def test_the_eight_losses_are_registered_with_papers():
    assert set(LOSSES) == {
        "vanilla", "gspo", "kl_cov", "clip_cov", "cispo", "gpg", "sapo", "geo_mean"
    }  # fmt: skip
    assert all(e.paper and e.paper.startswith("arXiv:") for e in POLICY_LOSSES.describe())
    assert algorithms.get_loss("ppo") is algorithms.get_loss("vanilla")
    assert algorithms.get_loss("gmpo") is algorithms.get_loss("geo_mean")


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_has_the_one_shared_signature(name):
    params = list(inspect.signature(algorithms.get_loss(name)).parameters.values())
    assert [(p.name, p.default) for p in params[: len(SHARED)]] == SHARED
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[4:-1])


def test_unknown_loss_name_gives_the_registry_error_with_a_suggestion():
    with pytest.raises(UnknownNameError, match="Did you mean 'gspo'"):
        algorithms.get_loss("gpso")


@pytest.mark.parametrize("name", LOSSES)
def test_an_unknown_option_raises_type_error_naming_it(name):
    b = random_batch(0, 2, 3)
    with pytest.raises(TypeError, match="'kl_cov_ration'"):
        call(name, b, kl_cov_ration=0.1)


def test_a_misspelt_option_gets_a_suggestion():
    b = random_batch(0, 2, 3)
    with pytest.raises(TypeError, match="did you mean 'clip_cov_ratio'"):
        call("clip_cov", b, clip_cov_ration=0.1)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("bad", [{"clip_ratio_low": -0.1}, {"clip_ratio_high": math.nan}])
def test_bad_clip_bounds_raise_even_where_unused(name, bad):
    with pytest.raises(ValueError, match="clip_ratio"):
        call(name, random_batch(0, 2, 3), **bad)


@pytest.mark.parametrize("name", LOSSES)
def test_mismatched_shapes_raise_a_clear_error(name):
    b = random_batch(0, 2, 3)
    b["adv"] = b["adv"][:, :2]
    with pytest.raises(ValueError, match=r"one \(B, T\) shape"):
        call(name, b)


@pytest.mark.parametrize("name", LOSSES)
def test_metrics_are_detached_scalars_with_the_common_keys(name):
    loss, metrics = call(name, random_batch(2, 3, 5, spread=0.5))
    assert loss.dim() == 0 and loss.requires_grad
    assert {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"} <= set(metrics)
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert not value.requires_grad, key
        assert not key.startswith("actor/")


def degenerate_batches():
    yield "B=0", random_batch(0, 0, 4)
    yield "T=0", random_batch(0, 3, 0)
    yield "all masked", random_batch(0, 3, 4, keep=0.0)
    b = random_batch(1, 3, 4, empty_rows=2)
    yield "fully masked rows", b
    b = random_batch(1, 3, 4, empty_rows=1, keep=0.6)
    padding = ~b["mask"]
    b["old"] = b["old"].masked_fill(padding, -math.inf)
    b["new"] = b["new"].detach().masked_fill(padding, -math.inf).requires_grad_()
    yield "-inf log-probs at padding", b


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", MODES)
def test_degenerate_inputs_give_finite_loss_gradient_and_metrics(name, mode):
    for label, b in degenerate_batches():
        loss, metrics = call(name, b, loss_agg_mode=mode)
        (grad,) = torch.autograd.grad(loss, b["new"], allow_unused=True)
        assert torch.isfinite(loss), label
        assert grad is None or bool(torch.isfinite(grad).all()), label
        assert grad is None or bool((grad[~b["mask"]] == 0).all()), label  # padding: no gradient
        assert all(bool(torch.isfinite(v)) for v in metrics.values()), label


@pytest.mark.parametrize("name", [n for n in LOSSES if n != "geo_mean"])
def test_rollout_is_weights_scale_each_token_loss(name):
    # A constant weight w scales every per-token loss, hence the aggregate, by w.
    b = random_batch(4, 3, 5, spread=0.4)
    plain, _ = call(name, b)
    weights = torch.full_like(b["old"], 2.5)
    weights[~b["mask"]] = math.nan  # whatever the weights hold at padding is ignored
    scaled, _ = call(name, b, rollout_is_weights=weights)
    assert scaled.item() == pytest.approx(2.5 * plain.item(), rel=1e-12)


def test_geo_mean_reduces_is_weights_to_their_geometric_mean_per_sequence():
    # weights (4, 1) on a 2-token row: sequence weight = exp((ln 4 + ln 1)/2) ≈ 2.
    b = random_batch(4, 1, 2, keep=1.0)
    plain, _ = call("geo_mean", b)
    weights = torch.tensor([[4.0, 1.0]], dtype=torch.float64)
    scaled, _ = call("geo_mean", b, rollout_is_weights=weights)
    assert scaled.item() == pytest.approx(2.0 * plain.item(), rel=1e-7)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_give_finite_losses_summed_in_float32(name, dtype):
    b = random_batch(3, 3, 5, dtype=dtype, empty_rows=1)
    for mode in MODES:
        loss, metrics = call(name, b, loss_agg_mode=mode)
        (grad,) = torch.autograd.grad(loss, b["new"])
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        assert torch.isfinite(loss) and bool(torch.isfinite(grad).all()), mode
