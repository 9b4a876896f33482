"""``rlkit from-verl``: verl launch scripts (reconstructed from verl's GRPO and PPO examples
and its DAPO recipe) become gin files; one trains a step on a tiny model."""

from __future__ import annotations

import json

import gin
import pytest

from rlkit.cli import main as rlkit_main
from rlkit.from_verl import KEYS, UNSUPPORTED, check_targets, overrides_of, translate
from rlkit.train import main as train_main


@pytest.fixture(autouse=True)
def _no_gin_left_behind():
    """`rlkit train` runs in this process: its gin bindings must not reach later tests."""
    yield
    gin.clear_config()


GRPO_SCRIPT = """set -x
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=1024 \\
    data.max_prompt_length=512 \\
    data.max_response_length=1024 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=sglang \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=5 \\
    algorithm.use_kl_in_reward=False \\
    trainer.critic_warmup=0 \\
    trainer.logger='["console","wandb"]' \\
    trainer.project_name='verl_grpo_example_gsm8k' \\
    trainer.experiment_name='qwen2_7b_function_rm' \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.save_freq=20 \\
    trainer.test_freq=5 \\
    trainer.total_epochs=15 $@
"""

PPO_SCRIPT = """python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=gae \\
    data.train_files="['a.parquet', 'b.parquet']" \\
    data.train_batch_size=512 \\
    actor_rollout_ref.model.path=google/gemma-2-2b-it \\
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \\
    critic.optim.lr=1e-5 \\
    critic.model.path=google/gemma-2-2b-it \\
    critic.ppo_micro_batch_size_per_gpu=4 \\
    algorithm.kl_ctrl.kl_coef=0.001 \\
    trainer.total_epochs=15
"""

DAPO_SCRIPT = """#!/usr/bin/env bash
project_name='DAPO'
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 20))
overlong_buffer_len=$((1024 * 4))
train_prompt_bsz=512
gen_prompt_bsz=$((train_prompt_bsz * 3))
MODEL_PATH=${MODEL_PATH:-"/models/Qwen2.5-32B"}
python3 -m verl.trainer.main_ppo \\
    data.train_files="${TRAIN_FILE}" \\
    data.prompt_key=prompt \\
    data.truncation='left' \\
    data.max_prompt_length=${max_prompt_length} \\
    data.max_response_length=${max_response_length} \\
    data.gen_batch_size=${gen_prompt_bsz} \\
    data.train_batch_size=${train_prompt_bsz} \\
    actor_rollout_ref.rollout.n=16 \\
    algorithm.adv_estimator=grpo \\
    algorithm.use_kl_in_reward=False \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    actor_rollout_ref.actor.clip_ratio_low=0.2 \\
    actor_rollout_ref.actor.clip_ratio_high=0.28 \\
    actor_rollout_ref.actor.clip_ratio_c=10.0 \\
    algorithm.filter_groups.enable=True \\
    algorithm.filter_groups.metric=acc \\
    algorithm.filter_groups.max_num_gen_batches=10 \\
    actor_rollout_ref.model.path="${MODEL_PATH}" \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \\
    actor_rollout_ref.actor.loss_agg_mode=token-mean \\
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \\
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \\
    actor_rollout_ref.rollout.val_kwargs.n=1 \\
    reward_model.reward_manager=dapo \\
    reward_model.overlong_buffer.enable=True \\
    reward_model.overlong_buffer.len=${overlong_buffer_len} \\
    reward_model.overlong_buffer.penalty_factor=1.0 \\
    trainer.project_name="${project_name}" \\
    trainer.total_epochs=1
"""


def test_every_mapped_key_names_an_rlkit_field():
    assert check_targets() == []
    assert not set(KEYS) & set(UNSUPPORTED)


def test_the_grpo_example_translates_with_every_other_key_listed():
    result = translate(overrides_of(GRPO_SCRIPT))
    b = result.bindings
    assert result.preset == "grpo"
    assert b["DataConfig.truncation"] == "error"  # the explicit setting comes last
    assert (b["DataConfig.train_batch_size"], b["OptimConfig.ppo_mini_batch_size"]) == (1024, 256)
    assert b["TrainerConfig.loggers"] == ("jsonl", "console", "wandb")
    assert b["TrainerConfig.total_epochs"] == 15 and b["RolloutConfig.engine"] == "sglang"
    skipped = {key: why for key, _, why in result.unsupported}
    # $HOME is the shell's, not the script's: listed, not guessed.
    assert skipped["data.train_files"] == "a shell value this script does not set"
    assert skipped["trainer.n_gpus_per_node"] == "processes come from `accelerate launch`"
    assert "FSDP2" in skipped["actor_rollout_ref.actor.fsdp_config.param_offload"]
    assert "tp_size" in skipped["actor_rollout_ref.rollout.tensor_model_parallel_size"]


def test_the_ppo_example_and_the_dapo_recipe_translate():
    ppo = translate(overrides_of(PPO_SCRIPT))
    assert ppo.preset == "ppo"
    assert ppo.bindings["DataConfig.train_files"] == ["a.parquet", "b.parquet"]
    assert ppo.bindings["ModelConfig.critic_path"] == "google/gemma-2-2b-it"
    dapo = translate(overrides_of(DAPO_SCRIPT))
    b = dapo.bindings
    assert dapo.preset == "dapo"
    assert (b["DataConfig.max_prompt_length"], b["RolloutConfig.max_response_length"]) == (
        2048,
        20480,
    )
    assert (b["DataConfig.gen_batch_size"], b["DataConfig.train_batch_size"]) == (1536, 512)
    assert b["AlgorithmConfig.overlong_buffer_len"] == 4096
    assert b["ModelConfig.path"] == "/models/Qwen2.5-32B"
    assert b["RolloutConfig.val_top_p"] == 0.7 and b["TrainerConfig.project_name"] == "DAPO"
    skipped = {key: why for key, _, why in dapo.unsupported}
    assert skipped["data.train_files"] == "a shell value this script does not set"
    assert "reward_model.reward_manager" in skipped


def test_a_translated_script_trains_one_step(tmp_path, tiny_model_dir, capfd):
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{i}+1="}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(8)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = tmp_path / "run_grpo.sh"
    script.write_text(
        f"""python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files={data} \\
    data.train_batch_size=4 \\
    data.max_prompt_length=64 \\
    data.max_response_length=4 \\
    actor_rollout_ref.model.path={tiny_model_dir} \\
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.name=hf \\
    actor_rollout_ref.rollout.n=2 \\
    trainer.logger='["console"]' \\
    trainer.total_training_steps=1 \\
    trainer.val_before_train=False \\
    trainer.save_freq=-1 \\
    trainer.n_gpus_per_node=1 \\
    trainer.default_local_dir={tmp_path / "out"}
"""
    )
    gin_file = tmp_path / "from_verl.gin"
    assert rlkit_main(["from-verl", str(script), "-o", str(gin_file)]) == 0
    text = gin_file.read_text()
    assert "#   trainer.n_gpus_per_node = 1: processes come from" in text
    extra = ["--gin_param", "DataConfig.reward = 'by_data_source'"]
    extra += ["--gin_param", "TrainerConfig.save_at_end = False"]
    assert train_main([str(gin_file), *extra]) == 0
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def test_nothing_to_translate_exits_2(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("set -x\npython3 -m verl.trainer.main_ppo\n")
    assert rlkit_main(["from-verl", str(script)]) == 2
    assert "no verl key=value overrides" in capsys.readouterr().err


def test_the_key_table_in_the_docs_lists_every_key():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "from_verl.md").read_text()
    for key, mapped in KEYS.items():
        assert f"| `{key}` | `{mapped.target}` |" in doc
    for key in UNSUPPORTED:
        assert f"| `{key}` |" in doc
