"""Every shipped experiment file parses, validates and names only registered components.

demo.gin, smollm2_gsm8k.gin and smollm2_gsm8k_calculator.gin are trained in their own
tests; the GPU-sized ones, and the calculator experiment's tool settings, are checked here
without a run (their model path is set on the command line).
"""

from __future__ import annotations

from pathlib import Path

import gin
import pytest

from rlkit.train import parse_config
from rlkit.trainer.config import ExperimentConfig

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
GPU_SIZED = ["gsm8k_grpo.gin", "gsm8k_dapo.gin", "gsm8k_ppo.gin", "dapo_recipe.gin"]
# What each file leaves to the command line: the model, and DAPO-Math-17k's location.
COMMAND_LINE = ["ModelConfig.path = '/models/any'", "DataConfig.train_files = '/data/x.parquet'"]


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize("name", GPU_SIZED)
def test_gpu_experiment_parses_and_validates(name):
    parse_config([str(EXPERIMENTS / name)], COMMAND_LINE)
    config = ExperimentConfig.from_gin()  # resolves every registry name it uses
    config.validate()
    # The GPU recipe: float32 parameters and Adam state, bf16 compute.
    assert config.model.dtype == "float32"
    assert config.trainer.mixed_precision == "bf16"


def test_dapo_recipe_matches_the_seed_settings():
    parse_config([str(EXPERIMENTS / "dapo_recipe.gin")], COMMAND_LINE)
    c = ExperimentConfig.from_gin()
    a = c.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert (a.filter_groups, a.filter_metric, a.max_num_gen_batches) == (True, "acc", 10)
    assert (a.overlong_buffer_len, a.overlong_penalty_factor) == (4096, 1.0)
    assert c.rollout.n == 16


def test_unknown_mixed_precision_is_refused_before_any_work():
    parse_config(
        [str(EXPERIMENTS / "gsm8k_grpo.gin")],
        ["ModelConfig.path = '/models/any'", "TrainerConfig.mixed_precision = 'bf32'"],
    )
    with pytest.raises(ValueError, match="mixed_precision must be no\\|bf16\\|fp16, got 'bf32'"):
        ExperimentConfig.from_gin().validate()


def test_smollm2_calculator_experiment_shows_the_policy_its_tool_and_scores_the_final_answer():
    from rlkit.data import render_prompt, resolve_chat_template
    from rlkit.models.tiny import train_byte_tokenizer
    from rlkit.rollout.agent_loop import agent_config
    from rlkit.tools import schemas

    parse_config([str(EXPERIMENTS / "smollm2_gsm8k_calculator.gin")], COMMAND_LINE[:1])
    c = ExperimentConfig.from_gin()
    c.validate()
    assert (c.rollout.agent_loop, agent_config(c.rollout.agent).tools) == (
        "tool_agent",
        ("calculator",),
    )
    assert c.data.reward == "final_turn" and c.data.reward_options["base"] == "gsm8k"
    # SmolLM2's own template ignores tools=; the configured one puts the schema in the prompt.
    tok = train_byte_tokenizer()
    tok.chat_template = resolve_chat_template(c.model.chat_template)
    text = render_prompt([{"role": "user", "content": "?"}], tok, tools=schemas(["calculator"]))
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text


def test_reward_model_demo_trains_on_the_reward_model_and_only_watches_the_verifier(tmp_path):
    from rlkit.trainer.config import reward_reads_reward_model
    from tests.reward_models import save_tiny_reward_model

    save_tiny_reward_model(tmp_path, chat_template=True)
    parse_config(
        [str(EXPERIMENTS / "reward_model_demo.gin")],
        [f"ModelConfig.path = '{tmp_path}'", f"RewardModelConfig.path = '{tmp_path}'"],
    )
    c = ExperimentConfig.from_gin()
    c.validate()
    assert reward_reads_reward_model(c.data.reward, c.data.reward_options) is True
    weights = {
        t["name"] if "name" in t else t["reward"]: t["weight"]
        for t in c.data.reward_options["terms"]
    }
    assert weights == {"reward_model": 1.0, "verifier": 0.0}


def test_the_one_step_off_demo_validates_with_a_server_engine_and_reward_workers(
    tiny_model_dir,
):
    parse_config(
        [str(EXPERIMENTS / "demo_one_step_off.gin")], [f"ModelConfig.path = '{tiny_model_dir}'"]
    )
    config = ExperimentConfig.from_gin()
    config.validate()  # one_step_off's own checks: an engine with its own weights, workers
    assert config.trainer.rollout_mode == "one_step_off"
    assert config.rollout.engine == "sglang" and config.data.reward_workers == 1


def test_the_async_demo_validates_two_steps_ahead_continuing_partial_rollouts(tiny_model_dir):
    from rlkit.trainer.config import async_depth

    parse_config([str(EXPERIMENTS / "demo_async.gin")], [f"ModelConfig.path = '{tiny_model_dir}'"])
    config = ExperimentConfig.from_gin()
    config.validate()
    assert config.trainer.rollout_mode == "async"
    assert config.trainer.partial_rollout == "continue"
    # One optimizer step per step (64 prompts, mini-batches of 64): 2 versions = 2 steps.
    assert async_depth(config) == (2, 2)
