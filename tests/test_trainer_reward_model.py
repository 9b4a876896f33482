"""The reward model as a trainer role: scoring, rendering, configuration errors."""

from __future__ import annotations

import json

import pytest
import torch

from rewards import RewardModel
from rewards.reward_model import reward_model_text
from rlkit.trainer.backend import TrainingBackend
from rlkit.trainer.config import ExperimentConfig, ModelConfig, RewardModelConfig
from rlkit.trainer.roles.reward_model import RewardModelScorer
from rlkit.trainer.timing import PhaseTimer
from tests.experiment_factory import small_experiment
from tests.reward_models import SENTENCES, save_tiny_reward_model


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rm")
    save_tiny_reward_model(path, chat_template=True)
    return str(path)


@pytest.fixture
def backend():
    b = TrainingBackend(strategy="none")
    yield b
    b.close()


PAIRS = [
    ([{"role": "user", "content": SENTENCES[0]}], SENTENCES[1]),
    ([{"role": "user", "content": SENTENCES[3]}], SENTENCES[4] + " " + SENTENCES[5]),
    ([{"role": "system", "content": SENTENCES[2]}, {"role": "user", "content": "two"}], "four"),
]


@pytest.mark.parametrize("budget", [1, 24, 8192])
def test_role_scores_equal_the_standalone_reward_model_at_any_token_budget(rm_dir, backend, budget):
    # The standalone RewardModel pools with transformers' own last-non-pad search; the role
    # pools at the attention mask's last token. Same texts, same scores, whatever the
    # micro-batching (budget 1: one row per forward).
    role = RewardModelScorer(
        RewardModelConfig(path=rm_dir, max_token_len_per_micro_batch=budget), backend
    )
    texts = [reward_model_text(role.tokenizer, p, r) for p, r in PAIRS]
    got = role.score_ids(role.encode(texts))
    want = RewardModel(rm_dir, batch_size=1).score([p for p, _ in PAIRS], [r for _, r in PAIRS])
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(s, 4) for s in got)) == 3  # three different texts, three scores


def test_a_truncated_text_keeps_its_end(rm_dir, backend):
    role = RewardModelScorer(RewardModelConfig(path=rm_dir, max_length=5), backend)
    rows = role.encode(["what is two plus two the answer is four"])
    full = role.tokenizer("what is two plus two the answer is four")["input_ids"]
    assert rows == [full[-5:]]


def test_trainer_scores_rollouts_with_the_reward_models_own_template(
    tiny_model_dir, rm_dir, tmp_path
):
    """The rollouts' scores are the reward model's scores of the decoded responses after
    the prompt's messages, rendered with the reward model's template (the policy uses
    another), and are logged as reward/reward_model/mean."""
    from rlkit.trainer.trainer import RLTrainer

    cfg = small_experiment(
        tiny_model_dir,
        tmp_path,
        data={"reward": "reward_model", "max_prompt_length": 64},
        trainer={"total_steps": 1},
    )
    cfg.reward_model = RewardModelConfig(path=rm_dir)
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        prompts = trainer.train_prompts
        scored = trainer.rollout.generate(prompts, [0, 1], trainer.rollout.sampling(), PhaseTimer())
        responses = trainer.tokenizer.batch_decode(
            [t.response_ids for t in scored.trajectories], skip_special_tokens=True
        )
        messages = [list(prompts.messages[i]) for i in scored.prompt_index]
        want = RewardModel(rm_dir, batch_size=1).score(messages, responses)
        assert scored.scores == pytest.approx(want, abs=1e-5)
        assert scored.metrics["reward/reward_model/mean"] == pytest.approx(
            sum(want) / len(want), abs=1e-5
        )
        metrics = trainer.step()
        assert "timing_s/reward_model" in metrics
        assert metrics["reward/reward_model/mean"] == pytest.approx(
            metrics["critic/score/mean"], abs=1e-6
        )
    finally:
        trainer.cleanup()


def _problems(tiny_model_dir, tmp_path, reward: str, rm: RewardModelConfig, **options) -> str:
    cfg = small_experiment(tiny_model_dir, tmp_path, data={"reward": reward, **options})
    cfg.reward_model = rm
    with pytest.raises(ValueError) as info:
        cfg.validate()
    return str(info.value)


def test_a_causal_lm_directory_is_not_a_reward_model(tiny_model_dir, tmp_path):
    text = _problems(tiny_model_dir, tmp_path, "reward_model", RewardModelConfig(tiny_model_dir))
    assert "has no classification head" in text and "Qwen2ForCausalLM" in text


def test_a_two_label_classifier_is_not_a_reward_model(tiny_model_dir, tmp_path):
    two = tmp_path / "two_labels"
    save_tiny_reward_model(two, chat_template=False, num_labels=2)
    text = _problems(tiny_model_dir, tmp_path, "reward_model", RewardModelConfig(str(two)))
    assert "has 2 labels" in text


def test_a_missing_reward_model_directory_is_named(tiny_model_dir, tmp_path):
    missing = str(tmp_path / "nowhere")
    text = _problems(tiny_model_dir, tmp_path, "reward_model", RewardModelConfig(missing))
    assert f"RewardModelConfig.path {missing!r}" in text


def test_the_reward_model_reward_without_a_reward_model_is_an_error(tiny_model_dir, tmp_path):
    terms = {"terms": [{"reward": "exact_match"}, {"reward": "reward_model", "weight": 0.5}]}
    text = _problems(
        tiny_model_dir, tmp_path, "weighted", RewardModelConfig(), reward_options=terms
    )
    assert "reads the reward model's score: set RewardModelConfig.path" in text


def test_a_reward_model_no_reward_reads_is_an_error(tiny_model_dir, rm_dir, tmp_path):
    text = _problems(tiny_model_dir, tmp_path, "exact_match", RewardModelConfig(rm_dir))
    assert "does not use its score" in text


def test_a_user_reward_function_may_read_the_score_itself(tiny_model_dir, rm_dir, tmp_path):
    cfg = small_experiment(tiny_model_dir, tmp_path, data={"reward": "my_rewards.py:score"})
    cfg.reward_model = RewardModelConfig(rm_dir)
    cfg.validate()  # a file's function may read context.reward_model_score: no error


def test_config_without_reward_model_section_defaults_to_none(tiny_model_dir):
    assert ExperimentConfig(model=ModelConfig(path=tiny_model_dir)).reward_model.path == ""


@pytest.mark.slow
def test_rl_against_a_bradley_terry_reward_model_raises_its_score(tmp_path):
    """A reward model trained on preference pairs (the right sum beats a near miss) scores
    held-out pairs correctly; GRPO against it raises its mean score on held-out prompts."""
    from rlkit.tasks.arithmetic import arithmetic_sft_model
    from rlkit.tasks.preference import arithmetic_reward_model
    from rlkit.trainer.trainer import RLTrainer

    # A policy that knows some addition (the reward model starts from it): smaller than
    # the demo's, larger than the demo_model_dir fixture (whose reward model stays at chance).
    policy = arithmetic_sft_model(str(tmp_path / "sft"), steps=500, batch_size=64, hidden_size=64)
    rm = arithmetic_reward_model(str(tmp_path / "rm"), policy_dir=policy, steps=300)
    accuracy = json.loads((tmp_path / "rm" / "bradley_terry.json").read_text())
    assert accuracy["heldout_pairwise_accuracy"] > 0.75
    cfg = small_experiment(
        policy,
        tmp_path / "run",
        data={"reward": "reward_model", "train_batch_size": 16, "val_limit": 64},
        rollout={"n": 8, "val_n": 4},
        optim={"lr": 2e-4, "ppo_mini_batch_size": 8, "micro_batch_size": 128},
        trainer={"total_steps": 12, "test_freq": 0},
    )
    cfg.reward_model = RewardModelConfig(rm)
    torch.manual_seed(0)
    history = RLTrainer(cfg).run()
    lines = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    vals = [m["val/arithmetic/score/mean"] for m in lines if "val/arithmetic/score/mean" in m]
    assert len(vals) == 2 and len(history) == 12
    assert vals[1] > vals[0] + 0.3, vals
