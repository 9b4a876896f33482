"""Small cases worked by hand; the arithmetic is in the comments."""

from __future__ import annotations

import math

import pytest
import torch

import estimators


def outcome(scores, index, lengths=None, width=None):
    """Rewards with each score on the row's last valid token; right-padded mask."""
    lengths = lengths or [1] * len(scores)
    width = width or max(lengths)
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.bool)
    for row, (score, n) in enumerate(zip(scores, lengths)):
        rewards[row, n - 1] = score
        mask[row, :n] = True
    return {"token_level_rewards": rewards, "response_mask": mask, "index": index}


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def per_row(advantages):
    return advantages[:, 0].tolist()


def test_grpo_group_1_0_0_1():
    # mean = 0.5; unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735;
    # A = +-0.5 / (0.57735 + 1e-6) = +-0.866024.
    advantages, returns = estimators.get("grpo")(**outcome([1, 0, 0, 1], [0, 0, 0, 0]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert per_row(advantages) == pytest.approx([expected, -expected, -expected, expected])
    assert expected == pytest.approx(0.8660, abs=1e-4)
    assert returns is advantages


def test_dr_grpo_and_grpo_without_std_are_mean_centred():
    # mean = 0.5 -> A = +-0.5.
    inputs = outcome([1, 0, 0, 1], [0, 0, 0, 0])
    for advantages in (
        estimators.get("dr_grpo")(**inputs)[0],
        estimators.get("grpo")(**inputs, norm_by_std=False)[0],
    ):
        assert per_row(advantages) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_broadcasts_over_valid_tokens_only():
    # Row 0 has 3 valid tokens, row 1 has 1: A = +-0.5 / (std 0.7071 + 1e-6) = +-0.70711.
    advantages, _ = estimators.get("grpo")(**outcome([1, 0], ["u", "u"], lengths=[3, 1]))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(advantages, [[a, a, a], [-a, 0.0, 0.0]])


def test_rloo_group_1_0_0_1():
    # Row 0: 1 - mean(0, 0, 1) = 1 - 1/3 = 2/3; row 1: 0 - mean(1, 0, 1) = -2/3.
    advantages, _ = estimators.get("rloo")(**outcome([1, 0, 0, 1], [0, 0, 0, 0]))
    assert per_row(advantages) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_opo_baseline_weights_scores_by_length():
    # Scores [1, 0], lengths [1, 3]: b = (1 * 1 + 3 * 0) / 4 = 0.25 -> A = [0.75, -0.25].
    advantages, _ = estimators.get("opo")(**outcome([1, 0], [0, 0], lengths=[1, 3]))
    close(advantages, [[0.75, 0.0, 0.0], [-0.25, -0.25, -0.25]])


def test_grpo_passk_rewards_only_the_best_by_its_margin():
    # Scores [3, 1, 2]: best 3, second 2, margin 1; unbiased std of [3, 1, 2] = 1
    # -> best row gets 1 / (1 + 1e-6), the others 0. Without std: margin 1.
    inputs = outcome([3, 1, 2], [0, 0, 0])
    assert per_row(estimators.get("grpo_passk")(**inputs)[0]) == pytest.approx(
        [1 / (1 + 1e-6), 0, 0]
    )
    assert per_row(estimators.get("grpo_passk")(**inputs, norm_by_std=False)[0]) == [1.0, 0.0, 0.0]


def test_grpo_passk_tie_for_best_gives_zero():
    # Scores [2, 2, 0]: margin 2 - 2 = 0.
    assert per_row(estimators.get("grpo_passk")(**outcome([2, 2, 0], [0, 0, 0]))[0]) == [0, 0, 0]


def test_grpo_batch_std_divides_by_the_std_of_the_whole_batch():
    # Groups {1, 0} and {1, 1}: centred [0.5, -0.5, 0, 0]. Batch scores [1, 0, 1, 1]:
    # mean 0.75, var = (3 * 0.0625 + 0.5625) / 3 = 0.25, std 0.5
    # -> A = [0.5, -0.5, 0, 0] / (0.5 + 1e-6) = [1, -1, 0, 0] (to 2e-6).
    advantages, _ = estimators.get("grpo_batch_std")(**outcome([1, 0, 1, 1], [0, 0, 1, 1]))
    a = 0.5 / (0.5 + 1e-6)
    assert per_row(advantages) == pytest.approx([a, -a, 0, 0])


def test_gpg_scales_by_batch_over_nonzero_scores():
    # Scores [1, 0, 0, 1]: alpha = 4 / 2 = 2; centred +-0.5 -> A = +-1; f_norm 4 -> +-0.25.
    inputs = outcome([1, 0, 0, 1], [0, 0, 0, 0])
    assert per_row(estimators.get("gpg")(**inputs)[0]) == pytest.approx([1, -1, -1, 1])
    assert per_row(estimators.get("gpg")(**inputs, f_norm=4.0)[0]) == pytest.approx(
        [0.25, -0.25, -0.25, 0.25]
    )


def test_reinforce_plus_plus_baseline_whitens_centred_scores():
    # Group {1, 0}, one token each: centred [0.5, -0.5]; token mean 0,
    # unbiased var = (0.25 + 0.25) / 1 = 0.5 -> A = +-0.5 / sqrt(0.5 + 1e-8) = +-0.70711.
    advantages, _ = estimators.get("reinforce_plus_plus_baseline")(**outcome([1, 0], [0, 0]))
    assert per_row(advantages) == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)])


def test_reinforce_plus_plus_discounted_returns():
    # r = [0, 0, 1], gamma = 0.5: G = [0.25, 0.5, 1]. Whitened: mean 7/12,
    # var = ((0.25 - 7/12)^2 + (0.5 - 7/12)^2 + (1 - 7/12)^2) / 2 = 0.14583.
    inputs = outcome([1], [0], lengths=[3])
    advantages, returns = estimators.get("reinforce_plus_plus")(**inputs, gamma=0.5)
    assert returns.tolist() == [[0.25, 0.5, 1.0]]
    g = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    expected = (g - g.mean()) / torch.sqrt(g.var() + 1e-8)
    assert advantages[0].tolist() == pytest.approx(expected.tolist(), rel=1e-7)
    assert g.var().item() == pytest.approx(0.14583, abs=1e-5)


def test_reinforce_plus_plus_discount_skips_an_interior_observation_span():
    # Valid tokens 0 and 3 (1, 2 are an observation span), reward 1 on token 3,
    # gamma = 0.5: G_3 = 1, G_0 = 0.5 * 1 (one valid step, not three).
    inputs = {
        "token_level_rewards": torch.tensor([[0.0, 9.0, 9.0, 1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 0, 0, 1]], dtype=torch.bool),
    }
    _, returns = estimators.get("reinforce_plus_plus")(**inputs, gamma=0.5)
    assert returns.tolist() == [[0.5, 0.0, 0.0, 1.0]]


def test_remax_subtracts_the_greedy_reward():
    # r = [0, 0, 1]: G = [1, 1, 1]; b = 0.4 -> A = [0.6, 0.6, 0.6]; padding stays 0.
    inputs = outcome([1], [0], lengths=[3], width=4)
    baselines = torch.tensor([0.4], dtype=torch.float64)
    advantages, returns = estimators.get("remax")(**inputs, reward_baselines=baselines)
    assert returns.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    close(advantages, [[0.6, 0.6, 0.6, 0.0]])


def test_gae_without_whitening():
    # r = [0, 0, 1], V = [0.5, 0.5, 0.5], gamma = 0.5, lam = 1:
    # delta_2 = 1 + 0 - 0.5 = 0.5; delta_1 = 0 + 0.25 - 0.5 = -0.25; delta_0 = -0.25.
    # A_2 = 0.5; A_1 = -0.25 + 0.5 * 0.5 = 0; A_0 = -0.25 + 0.5 * 0 = -0.25.
    # returns = A + V = [0.25, 0.5, 1.0].
    inputs = {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
        "response_mask": torch.ones(1, 3, dtype=torch.bool),
        "values": torch.full((1, 3), 0.5, dtype=torch.float64),
    }
    advantages, returns = estimators.get("gae")(**inputs, gamma=0.5, lam=1.0, whiten=False)
    close(advantages, [[-0.25, 0.0, 0.5]])
    close(returns, [[0.25, 0.5, 1.0]])


def test_gae_skips_an_observation_span_and_ignores_its_rewards():
    # Mask [1, 0, 1]: token 1 is an observation (its reward 7 and value 9 ignored).
    # delta_2 = 1 + 0 - 0.5 = 0.5; delta_0 = 0 + 0.5 * V_2 - V_0 = 0.25 - 0.5 = -0.25;
    # A_0 = -0.25 + 0.5 * 1 * A_2 = 0 (one discount step across the span).
    inputs = {
        "token_level_rewards": torch.tensor([[0.0, 7.0, 1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 0, 1]], dtype=torch.bool),
        "values": torch.tensor([[0.5, 9.0, 0.5]], dtype=torch.float64),
    }
    advantages, returns = estimators.get("gae")(**inputs, gamma=0.5, lam=1.0, whiten=False)
    close(advantages, [[0.0, 0.0, 0.5]])
    close(returns, [[0.5, 0.0, 1.0]])


def test_gae_whitening_uses_valid_tokens_only():
    # Unwhitened A = [-0.25, 0, 0.5] (above); mean 1/12, unbiased var
    # = ((-1/3)^2 + (1/12)^2 + (5/12)^2) / 2 = 0.14583 -> A = (A - 1/12) / sqrt(var + 1e-8).
    inputs = {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 1, 1, 0]], dtype=torch.bool),
        "values": torch.tensor([[0.5, 0.5, 0.5, 3.0]], dtype=torch.float64),
    }
    advantages, _ = estimators.get("gae")(**inputs, gamma=0.5, lam=1.0)
    raw = torch.tensor([-0.25, 0.0, 0.5], dtype=torch.float64)
    expected = ((raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)).tolist() + [0.0]
    assert advantages[0].tolist() == pytest.approx(expected, rel=1e-7)
