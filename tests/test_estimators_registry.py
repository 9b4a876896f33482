"""The estimators package's public contract: names, one signature, clear errors."""

from __future__ import annotations

import inspect

import pytest
import torch

import estimators
from rlkit.registry import ESTIMATORS, UnknownNameError
from rlkit.testing import declared_inputs

EXPECTED = {
    "gae",
    "grpo",
    "dr_grpo",
    "grpo_passk",
    "grpo_batch_std",
    "rloo",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "gpg",
    "prime",
}
SIGNATURE = [
    ("token_level_rewards", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
    ("response_mask", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
    ("index", inspect.Parameter.KEYWORD_ONLY, None),
    ("values", inspect.Parameter.KEYWORD_ONLY, None),
    ("reward_baselines", inspect.Parameter.KEYWORD_ONLY, None),
    ("gamma", inspect.Parameter.KEYWORD_ONLY, 1.0),
    ("lam", inspect.Parameter.KEYWORD_ONLY, 1.0),
    ("norm_by_std", inspect.Parameter.KEYWORD_ONLY, True),
    ("epsilon", inspect.Parameter.KEYWORD_ONLY, 1e-6),
    ("options", inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty),
]


def small_inputs(name=None):
    """Shared inputs, plus a (B, T) tensor for each input ``name`` declares."""
    names = declared_inputs(name) if name else ()
    extra = {key: torch.tensor([[0.5, -0.25], [0.0, 0.0]]) for key in names}
    return {
        "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        "response_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        "index": ["p", "p"],
        "values": torch.zeros(2, 2),
        "reward_baselines": torch.zeros(2),
        **extra,
    }


def test_importing_estimators_registers_every_builtin():
    assert set(estimators.names()) >= EXPECTED
    assert estimators.names() == ESTIMATORS.names()


def test_get_and_describe_delegate_to_the_registry():
    assert estimators.get("grpo") is ESTIMATORS.get("grpo")
    described = {entry.name: entry for entry in estimators.describe()}
    for name in EXPECTED:
        assert described[name].paper and described[name].paper.startswith("arXiv:")
        assert described[name].summary


def test_verl_vectorised_names_are_aliases():
    assert estimators.get("grpo_vectorized") is estimators.get("grpo")
    assert estimators.get("rloo_vectorized") is estimators.get("rloo")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_estimator_has_the_one_signature_and_a_docstring(name):
    # A declared input is one more keyword-only argument (default None) before **options.
    fn = estimators.get(name)
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    declared = [(key, inspect.Parameter.KEYWORD_ONLY, None) for key in declared_inputs(name)]
    assert params == SIGNATURE[:-1] + declared + SIGNATURE[-1:]
    doc = inspect.getdoc(fn)
    assert "arXiv:" in doc and "Returns:" in doc and "Raises:" in doc


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_estimator_accepts_and_ignores_arguments_it_does_not_use(name):
    advantages, returns = estimators.get(name)(**small_inputs(name), gamma=0.9, lam=0.9)
    assert advantages.shape == returns.shape == (2, 2)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unknown_options_raise_type_error_naming_them(name):
    with pytest.raises(TypeError, match="gama"):
        estimators.get(name)(**small_inputs(name), gama=0.9)


def test_verl_spelling_of_the_std_flag_points_to_ours():
    with pytest.raises(TypeError, match="norm_adv_by_std_in_grpo.*norm_by_std"):
        estimators.get("grpo")(**small_inputs(), norm_adv_by_std_in_grpo=False)


def test_unknown_estimator_name_suggests_the_nearest():
    with pytest.raises(UnknownNameError, match="Did you mean 'grpo'"):
        estimators.get("grpoo")


@pytest.mark.parametrize(
    ("name", "argument"),
    [
        ("gae", "values"),
        ("remax", "reward_baselines"),
        ("prime", "process_rewards"),
        *[
            (n, "index")
            for n in [
                "grpo",
                "dr_grpo",
                "grpo_passk",
                "grpo_batch_std",
                "rloo",
                "opo",
                "reinforce_plus_plus_baseline",
                "gpg",
                "prime",
            ]
        ],
    ],
)
def test_missing_required_argument_raises_value_error_naming_it(name, argument):
    inputs = {**small_inputs(name), argument: None}
    with pytest.raises(ValueError, match=f"{name} needs `{argument}`"):
        estimators.get(name)(**inputs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"response_mask": torch.ones(2, 3)}, "does not match"),
        ({"token_level_rewards": torch.zeros(2)}, r"must be \(B, T\)"),
        ({"token_level_rewards": torch.zeros(2, 2, dtype=torch.long)}, "floating point"),
        ({"values": torch.zeros(2, 3)}, "`values` must be"),
        ({"reward_baselines": torch.zeros(3)}, "`reward_baselines` must be"),
        ({"index": ["p"]}, "1 group ids but the batch has B = 2"),
        ({"index": torch.zeros(2, 1)}, "1-D tensor"),
    ],
)
def test_malformed_inputs_raise_clear_errors(change, message):
    inputs = {**small_inputs(), **change}
    name = "gae" if "values" in change else "remax" if "reward_baselines" in change else "grpo"
    with pytest.raises((ValueError, TypeError), match=message):
        estimators.get(name)(**inputs)


@pytest.mark.parametrize("kwargs", [{"gamma": 1.5}, {"lam": -0.1}, {"gamma": float("nan")}])
def test_discounts_outside_unit_interval_are_rejected(kwargs):
    with pytest.raises(ValueError, match="must be a number in \\[0, 1\\]"):
        estimators.get("gae")(**small_inputs(), **kwargs)


def test_gae_whiten_option_must_be_a_bool():
    with pytest.raises(TypeError, match="whiten must be True or False"):
        estimators.get("gae")(**small_inputs(), whiten="false")


def test_gpg_f_norm_must_be_positive():
    with pytest.raises(ValueError, match="f_norm"):
        estimators.get("gpg")(**small_inputs(), f_norm=0.0)


def test_negative_epsilon_is_rejected():
    with pytest.raises(ValueError, match="epsilon"):
        estimators.get("grpo")(**small_inputs(), epsilon=-1e-6)


def test_estimators_do_not_track_gradients():
    inputs = small_inputs()
    inputs["values"] = torch.zeros(2, 2, requires_grad=True)
    advantages, returns = estimators.get("gae")(**inputs)
    assert not advantages.requires_grad and not returns.requires_grad
