"""Algorithm: what a step needs and which roles run follow from the registered pieces;
losses get declared inputs."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms
from rlkit.registry import POLICY_LOSSES
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.algorithm import Algorithm
from rlkit.trainer.batch import build_batch
from rlkit.trainer.data_contract import DataContractError
from tests.experiment_factory import small_experiment

SEEN: dict[str, torch.Tensor] = {}


def records_inputs(old_log_prob, log_prob, advantages, response_mask, **kwargs):
    """Vanilla PPO that keeps the declared inputs it received, for the test to read."""
    SEEN.update(
        ref_log_prob=kwargs.pop("ref_log_prob"), policy_version=kwargs.pop("policy_version")
    )
    return algorithms.get_loss("vanilla")(
        old_log_prob, log_prob, advantages, response_mask, **kwargs
    )


def bad_input(old_log_prob, log_prob, advantages, response_mask, **kwargs):
    """Declares an input that does not exist."""
    raise AssertionError("never called")


@pytest.fixture(autouse=True)
def test_losses():
    # Registered only while this module's tests run: other tests iterate over every
    # registered loss.
    POLICY_LOSSES.add(
        "test_records_inputs", records_inputs, inputs=("ref_log_prob", "policy_version")
    )
    POLICY_LOSSES.add("test_bad_input", bad_input, inputs=("reference_logits",))
    yield
    POLICY_LOSSES.unregister("test_records_inputs")
    POLICY_LOSSES.unregister("test_bad_input")


def _algorithm(tmp_path, **algorithm) -> Algorithm:
    optim = algorithm.pop("optim", {"ppo_mini_batch_size": 4})  # one mini-batch: on-policy
    return Algorithm(small_experiment("unused", tmp_path, algorithm=algorithm, optim=optim))


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, dict(greedy_baseline=False, old_log_prob=False)),
        ({"adv_estimator": "remax"}, dict(greedy_baseline=True)),
        ({"use_kl_loss": True}, dict(old_log_prob=False)),
        ({"use_kl_in_reward": True}, dict(old_log_prob=True)),
        ({"rollout_is_level": "token"}, dict(old_log_prob=True)),
        ({"optim": {"ppo_mini_batch_size": 2}}, dict(old_log_prob=True, entropy=False)),
        ({"entropy_coeff": 0.01, "optim": {"ppo_mini_batch_size": 2}}, dict(entropy=True)),
    ],
)
def test_needs_follow_from_the_registered_pieces(tmp_path, settings, expected):
    needs = _algorithm(tmp_path, **settings).needs
    for name, value in expected.items():
        assert getattr(needs, name) is value, name


@pytest.mark.parametrize(
    ("settings", "roles"),
    [
        ({}, ("actor",)),
        ({"adv_estimator": "gae"}, ("actor", "critic")),
        ({"use_kl_in_reward": True}, ("actor", "reference")),
        ({"policy_loss": "test_records_inputs"}, ("actor", "reference")),
        ({"adv_estimator": "gae", "use_kl_loss": True}, ("actor", "reference", "critic")),
    ],
)
def test_the_roles_follow_from_the_inputs_the_pieces_read(tmp_path, settings, roles):
    assert _algorithm(tmp_path, **settings).roles == roles


def test_a_loss_declaring_an_unknown_input_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(DataContractError) as caught:
        _algorithm(tmp_path, policy_loss="test_bad_input")
    message = str(caught.value)
    assert "policy loss 'test_bad_input' reads the input 'reference_logits'" in message
    # What could be read instead: the batch's own tensors and the built-in roles' ones.
    for name in ("ref_log_prob", "values", "rollout_log_prob", "entropy", "scores"):
        assert repr(name) in message


def _tool_batch():
    # Two responses to one prompt; each has a tool span (loss mask 0) at t = 1..2.
    def traj(first: int) -> Trajectory:
        return Trajectory(
            prompt_ids=[5, 6],
            response_ids=[first, 30, 31, 9],
            loss_mask=[1, 0, 0, 1],
            rollout_log_probs=[-0.5, 0.0, 0.0, -0.5],
            policy_version=[2, -1, -1, 2],
            prompt_index=0,
        )

    return build_batch(
        [traj(7), traj(8)],
        pad_token_id=0,
        response_width=4,
        index=[0, 0],
        scores=[1.0, 0.0],
        acc=[1.0, 0.0],
        data_sources=["toy", "toy"],
    )


def test_estimators_see_the_loss_mask_so_tool_tokens_get_no_advantage(tmp_path):
    batch = _tool_batch()
    _algorithm(tmp_path).compute_advantages(batch)
    # GRPO, scores (1, 0): mean 0.5, unbiased std 0.7071, A = ±0.5 / 0.7071 = ±0.7071,
    # on the two sampled tokens (t = 0, 3) only.
    a = 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[a, 0, 0, a], [-a, 0, 0, -a]])
    torch.testing.assert_close(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    # The score sat on the last sampled token, t = 3.
    assert batch.token_level_rewards.tolist() == [[0, 0, 0, 1.0], [0, 0, 0, 0]]


def test_gae_skips_the_tool_span_and_the_actor_loss_has_no_gradient_there(tmp_path):
    batch = _tool_batch()
    algo = _algorithm(tmp_path, adv_estimator="gae", gamma=0.5, lam=1.0)
    batch.extras["values"] = torch.zeros(2, 4)
    algo.compute_advantages(batch)
    # gamma = 0.5, lam = 1, V = 0: the return at t = 0 skips t = 1, 2 (mask 0), so it is
    # 0.5 * r_3 = 0.5 for row 0, not 0.5**3 = 0.125 as it would be without skipping.
    assert batch.returns[0, 0].item() == pytest.approx(0.5)
    assert batch.returns[0, 3].item() == pytest.approx(1.0)
    log_prob = torch.full((2, 4), -0.5, requires_grad=True)
    loss, _, _ = algo.actor_loss(batch, (log_prob, torch.zeros(2, 4)), algo.normalisers(batch))
    loss.backward()
    assert log_prob.grad[:, 1:3].abs().sum() == 0  # tool tokens: no gradient
    assert log_prob.grad[0, 0] != 0


def test_a_loss_receives_its_declared_inputs_from_the_micro_batch(tmp_path):
    batch = _tool_batch()
    algo = _algorithm(tmp_path, policy_loss="test_records_inputs")
    algo.compute_advantages(batch)
    batch.extras["ref_log_prob"] = torch.full((2, 4), -0.7)
    log_prob = torch.full((2, 4), -0.5, requires_grad=True)
    algo.actor_loss(batch, (log_prob, torch.zeros(2, 4)), algo.normalisers(batch))
    assert SEEN["ref_log_prob"] is batch.extras["ref_log_prob"]
    assert SEEN["policy_version"].tolist() == [[2, -1, -1, 2]] * 2


def test_value_loss_is_chosen_by_name(tmp_path):
    batch = _tool_batch()
    batch.extras["values"] = torch.zeros(2, 4)
    batch.returns = torch.full((2, 4), 2.0)
    vpreds = torch.full((2, 4), 1.0)
    norms = {"num_tokens": 4, "num_seqs": 2, "norm_length": 4}
    # Values 0, clip 0.5: clipped v = 0.5, max((1-2)^2, (0.5-2)^2) = 2.25 -> 0.5 * 2.25.
    clipped, _, _ = _algorithm(tmp_path).critic_loss(batch, vpreds, norms)
    # mse: 0.5 * (1-2)^2 = 0.5 on every sampled token.
    mse, _, _ = _algorithm(tmp_path, value_loss="mse").critic_loss(batch, vpreds, norms)
    assert clipped.item() == pytest.approx(1.125) and mse.item() == pytest.approx(0.5)


def test_algorithm_config_math_selects_the_plain_or_fused_core_math(tmp_path):
    import algorithms
    import estimators
    from rlkit.trainer.algorithm import Algorithm
    from tests.experiment_factory import small_experiment

    try:
        Algorithm(small_experiment("unused", tmp_path, algorithm={"math": "plain"}))
        assert algorithms.get_math() == estimators.get_math() == "plain"
    finally:
        Algorithm(small_experiment("unused", tmp_path))  # the default: fused
    assert algorithms.get_math() == estimators.get_math() == "fused"
