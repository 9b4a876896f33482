"""The trainer's reward call passes each response's token count to the reward."""

import pytest
from transformers import AutoTokenizer

from rlkit.rollout.base import RolloutBatch
from rlkit.rollout.trajectory import trajectories_from_rollout
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import score_rollout
from tests.experiment_factory import small_experiment


@pytest.mark.parametrize(
    ("reward", "options"),
    [
        ("length_penalty", {"max_response_length": 4}),
        (
            "combined",
            {"base": "exact_match", "shaping": [("length_penalty", {"max_response_length": 4})]},
        ),
    ],
)
def test_length_shaping_rewards_see_the_response_token_count(
    tiny_model_dir, tmp_path, reward, options
):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_experiment(
        tiny_model_dir, tmp_path, data={"reward": reward, "reward_options": options}
    )
    rollout = RolloutBatch(
        prompt_ids=[[5], [5], [6]],
        response_ids=[[40], [40, 41, 42], [43, 44, 45, 46, 2]],
        rollout_log_probs=[[0.0], [0.0] * 3, [0.0] * 5],
        finish_reasons=["length", "length", "stop"],
        prompt_index=[0, 0, 1],
    )
    prompts = PromptSet(
        token_ids=[[5], [6]], ground_truths=["no", "no"], data_sources=["arithmetic"] * 2
    )
    trajectories = trajectories_from_rollout(rollout, policy_version=0)
    scored = score_rollout(trajectories, prompts, tok, cfg, groups=[0, 0, 1])
    # -L / Lmax with Lmax = 4, clipped at -1 (exact match adds 0: "no" is never the answer):
    # 1 token -> -0.25, 3 tokens -> -0.75, 5 tokens -> -1.
    assert scored.scores == [-0.25, -0.75, -1.0]
    assert scored.metrics.get("reward/num_errors", 0) == 0
