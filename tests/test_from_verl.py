"""``rlkit from-verl``: verl launch scripts (reconstructed from verl's GRPO and PPO examples
and its DAPO recipe) become gin files with every key accounted for; the script is read as
bash reads it (checked against bash itself); one trains a step on a tiny model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import gin
import pytest

from rlkit.cli import main as rlkit_main
from rlkit.from_verl import KEYS, UNSUPPORTED, check_targets, overrides_of, translate
from rlkit.from_verl.hydra_values import hydra_value
from rlkit.from_verl.key_table import ALIASES, MATCHING
from rlkit.from_verl.shell import ScriptReader
from rlkit.from_verl.verl_keys import is_verl_key, older_release
from rlkit.train import build_config, parse_config
from rlkit.train import main as train_main

DAPO_RECIPE = Path(__file__).parent / "verl_scripts" / "dapo_recipe.sh"
HOME = {"HOME": "/home/u"}


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


def test_every_mapped_key_names_an_rlkit_field_and_every_table_key_is_verls():
    assert check_targets() == []
    assert not set(KEYS) & set(UNSUPPORTED)
    tables = {*KEYS, *UNSUPPORTED, *MATCHING, *ALIASES}
    not_verl = sorted(
        k for k in tables if not (is_verl_key(k) or older_release(k)) and k not in ALIASES.values()
    )
    assert not_verl == [
        k for k in not_verl if k.startswith(("reward_model.reward_kwargs", "reward.reward_kwargs"))
    ]


def _words(reader, text):
    return [w.text for c in reader.commands(text) for w in c.words]


def test_the_shell_reads_nested_defaults_home_arithmetic_and_quotes_as_bash_does():
    reader = ScriptReader({"HOME": "/home/u", "FROM_ENV": "set"})
    script = """
    ROOT=${ROOT:-"${HOME}/verl"}
    MODEL=${MODEL:-"${ROOT}/models/${NAME:-qwen}"}
    FROM_ENV=${FROM_ENV:-default}
    a=7; b=2
    echo $MODEL $FROM_ENV $(( (a + 1) / b * 3 )) $((-7 / 2)) $((-7 % 3)) \
        'single $a' "double $a \\$a" ~/x ${#b} ${EMPTY:+alt} $@
    """
    # (7 + 1) / 2 * 3 = 12; bash truncates toward zero: -7 / 2 = -3 and -7 % 3 = -1.
    assert _words(reader, script) == [
        "echo",
        "/home/u/verl/models/qwen",
        "set",
        "12",
        "-3",
        "-1",
        "single $a",
        "double 7 $a",
        "/home/u/x",
        "1",
    ]


def test_what_the_shell_cannot_know_is_named_not_guessed():
    reader = ScriptReader({})
    words = [
        w for c in reader.commands("now=$(date +%s)\necho a.b=$now c.d=${UNSET}/x") for w in c.words
    ]
    assert [(w.text, w.missing) for w in words[1:]] == [
        ("a.b=", ["$(date +%s)"]),
        ("c.d=/x", ["$UNSET"]),
    ]


def test_the_reader_gives_the_same_words_as_bash_on_the_dapo_recipe(tmp_path):
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the reader against it"
    # bash runs the recipe with `ray` printing its arguments instead of submitting a job.
    script = tmp_path / "run.sh"
    script.write_text(
        DAPO_RECIPE.read_text().replace(
            "set -xeuo pipefail", "set -euo pipefail\nray() { printf '%s\\0' \"$@\"; }"
        )
    )
    env = {"HOME": "/home/u", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([bash, str(script)], capture_output=True, text=True, env=env, check=True)
    by_bash = run.stdout.split("\0")[:-1]
    commands = ScriptReader(env).commands(DAPO_RECIPE.read_text())
    ray = next(c for c in commands if c.words[0].text == "ray")
    ours = [w.text for w in ray.words[1:]]
    assert len(ours) > 80 and ours == by_bash  # every word, wrapper included


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[a.parquet]", ["a.parquet"]),
        ("[console,wandb]", ["console", "wandb"]),
        ('["console", "wandb"]', ["console", "wandb"]),
        ("['a.parquet', 'b.parquet']", ["a.parquet", "b.parquet"]),
        ("{a: 1, b: [x, y]}", {"a": 1, "b": ["x", "y"]}),
        ("1e-6", 1e-6),
        ("0.", 0.0),
        ("-1", -1),
        ("1_000", 1000),
        ("True", True),
        ("false", False),
        ("null", None),
        ("'True'", "True"),
        ("token-mean", "token-mean"),
        ("/p/x.parquet", "/p/x.parquet"),
    ],
)
def test_override_values_are_read_as_hydra_reads_them(text, value):
    assert hydra_value(text) == value


DAPO_BINDINGS = {
    "DataConfig.train_files": "/home/u/verl/data/dapo-math-17k.parquet",
    "DataConfig.val_files": ["/home/u/verl/data/aime-2024.parquet"],
    "DataConfig.truncation": "filter",
    "DataConfig.max_prompt_length": 2048,
    "RolloutConfig.max_response_length": 20480,
    "DataConfig.gen_batch_size": 384,  # 128 * 3
    "DataConfig.train_batch_size": 128,
    "RolloutConfig.n": 16,
    "AlgorithmConfig.adv_estimator": "grpo",
    "AlgorithmConfig.use_kl_in_reward": False,
    "AlgorithmConfig.kl_coef": 0.0,
    "AlgorithmConfig.use_kl_loss": False,
    "AlgorithmConfig.kl_loss_coef": 0.0,
    "AlgorithmConfig.clip_ratio_low": 0.2,
    "AlgorithmConfig.clip_ratio_high": 0.28,
    "AlgorithmConfig.clip_ratio_c": 10.0,
    "AlgorithmConfig.filter_groups": True,
    "AlgorithmConfig.max_num_gen_batches": 10,
    "AlgorithmConfig.filter_metric": "acc",
    "ModelConfig.use_remove_padding": True,
    "OptimConfig.use_dynamic_bsz": True,
    "OptimConfig.max_token_len_per_micro_batch": 2816,  # (2048 + 20480) / 8
    "RolloutConfig.engine": "vllm",
    "ModelConfig.path": "/home/u/verl/models/Qwen2.5-32B",
    "ModelConfig.gradient_checkpointing": True,
    "OptimConfig.lr": 1e-6,
    "OptimConfig.warmup_steps": 10,
    "OptimConfig.weight_decay": 0.1,
    "OptimConfig.ppo_mini_batch_size": 32,
    "ModelConfig.dtype": "bfloat16",
    "AlgorithmConfig.entropy_coeff": 0.0,
    "OptimConfig.grad_clip": 1.0,
    "AlgorithmConfig.loss_agg_mode": "token-mean",
    "ModelConfig.ulysses_sequence_parallel_size": 8,
    "RolloutConfig.temperature": 1.0,
    "RolloutConfig.top_p": 1.0,
    "RolloutConfig.top_k": -1,
    "RolloutConfig.val_temperature": 1.0,
    "RolloutConfig.val_top_p": 0.7,
    "RolloutConfig.val_top_k": -1,
    "RolloutConfig.val_do_sample": True,
    "RolloutConfig.val_n": 1,
    "AlgorithmConfig.overlong_buffer_len": 4096,
    "AlgorithmConfig.overlong_penalty_factor": 1.0,
    "TrainerConfig.loggers": ("jsonl", "console", "wandb"),
    "TrainerConfig.project_name": "DAPO-Qwen2.5-32B",
    "TrainerConfig.experiment_name": "qwen25-32b-npu-gbs128",
    "TrainerConfig.val_before_train": True,
    "TrainerConfig.test_freq": 5,
    "TrainerConfig.save_freq": 20,
    "TrainerConfig.total_epochs": 1,
    "TrainerConfig.output_dir": "/home/u/verl/ckpts/DAPO-Qwen2.5-32B/qwen25-32b-npu-gbs128",
    "TrainerConfig.platform": "npu",
    "TrainerConfig.resume_mode": "auto",
    "TrainerConfig.cpu_offload": True,
    "RolloutConfig.engine_options": {
        "gpu_memory_utilization": 0.9,
        "tp_size": 4,
        "enable_chunked_prefill": True,
        "server_args": ["--max-num-batched-tokens", "22528"],  # 2048 + 20480
    },
}


def test_the_dapo_recipe_keeps_every_value(tmp_path):
    result = translate(overrides_of(DAPO_RECIPE.read_text(), HOME))
    assert result.preset == "dapo"
    assert result.bindings == DAPO_BINDINGS
    assert not result.unknown
    assert [(k, why[:30]) for k, _, why in result.unsupported] == [
        (
            "actor_rollout_ref.model.override_config.attention_dropout",
            "rlkit loads the model's own co",
        )
    ]
    used = {key for key, _, _ in result.used}
    assert used == {
        "data.prompt_key",
        "data.filter_overlong_prompts",
        "actor_rollout_ref.actor.use_torch_compile",
        "actor_rollout_ref.ref.use_torch_compile",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.enable_chunked_prefill",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "reward_model.reward_manager",
        "reward_model.overlong_buffer.enable",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
    }
    # 2 nodes x 16 devices: one accelerate launch per node.
    assert result.launch.command("dapo.gin") == (
        "accelerate launch --num_machines 2 --num_processes 32 --machine_rank $NODE_RANK "
        "--main_process_ip $MASTER_ADDR --main_process_port 29500 -m rlkit.train dapo.gin"
    )
    gin_file = tmp_path / "dapo.gin"
    gin_file.write_text(result.gin(str(DAPO_RECIPE), str(gin_file)))
    parse_config([str(gin_file)], [])
    config = build_config()  # the translation is a valid rlkit experiment
    assert config.rollout.engine_options["tp_size"] == 4 and config.trainer.cpu_offload


def test_an_exported_variable_wins_over_the_scripts_default_as_in_bash():
    env = {**HOME, "MODEL_PATH": "/fast/models/qwen", "CKPTS_DIR": "/ckpt/run1"}
    b = translate(overrides_of(DAPO_RECIPE.read_text(), env)).bindings
    assert b["ModelConfig.path"] == "/fast/models/qwen"
    assert b["TrainerConfig.output_dir"] == "/ckpt/run1"


def test_the_grpo_example_translates_with_every_key_accounted_for():
    result = translate(overrides_of(GRPO_SCRIPT, HOME))
    assert result.preset == "grpo" and not result.unknown
    assert result.bindings == {
        "AlgorithmConfig.adv_estimator": "grpo",
        "DataConfig.train_files": "/home/u/data/gsm8k/train.parquet",
        "DataConfig.val_files": "/home/u/data/gsm8k/test.parquet",
        "DataConfig.train_batch_size": 1024,
        "DataConfig.max_prompt_length": 512,
        "RolloutConfig.max_response_length": 1024,
        # filter_overlong_prompts=True drops long prompts; truncation='error' never fires.
        "DataConfig.truncation": "filter",
        "ModelConfig.path": "Qwen/Qwen2-7B-Instruct",
        "OptimConfig.lr": 1e-6,
        "ModelConfig.use_remove_padding": True,
        "OptimConfig.ppo_mini_batch_size": 256,
        "OptimConfig.micro_batch_size": 40,
        "AlgorithmConfig.use_kl_loss": True,
        "AlgorithmConfig.kl_loss_coef": 0.001,
        "AlgorithmConfig.kl_loss_type": "low_var_kl",
        "AlgorithmConfig.entropy_coeff": 0,
        "ModelConfig.gradient_checkpointing": True,
        "RolloutConfig.engine": "sglang",
        "RolloutConfig.n": 5,
        "AlgorithmConfig.use_kl_in_reward": False,
        "AlgorithmConfig.critic_warmup": 0,
        "TrainerConfig.loggers": ("jsonl", "console", "wandb"),
        "TrainerConfig.project_name": "verl_grpo_example_gsm8k",
        "TrainerConfig.experiment_name": "qwen2_7b_function_rm",
        "TrainerConfig.save_freq": 20,
        "TrainerConfig.test_freq": 5,
        "TrainerConfig.total_epochs": 15,
        "RolloutConfig.engine_options": {"tp_size": 2, "mem_fraction_static": 0.6},
    }
    used = {key: how for key, _, how in result.used}
    assert set(used) == {
        "data.filter_overlong_prompts",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
    }
    assert not result.unsupported
    assert (
        result.launch.command("g.gin") == "accelerate launch --num_processes 8 -m rlkit.train g.gin"
    )


def test_the_ppo_example_translates_with_every_key_accounted_for():
    result = translate(overrides_of(PPO_SCRIPT))
    assert result.preset == "ppo" and not result.unknown and not result.used
    assert result.bindings == {
        "AlgorithmConfig.adv_estimator": "gae",
        "DataConfig.train_files": ["a.parquet", "b.parquet"],
        "DataConfig.train_batch_size": 512,
        "ModelConfig.path": "google/gemma-2-2b-it",
        "OptimConfig.ppo_mini_batch_size": 128,
        "OptimConfig.critic_lr": 1e-5,
        "ModelConfig.critic_path": "google/gemma-2-2b-it",
        "AlgorithmConfig.kl_coef": 0.001,
        "TrainerConfig.total_epochs": 15,
    }
    assert [(k, why) for k, _, why in result.unsupported] == [
        ("critic.ppo_micro_batch_size_per_gpu", "the critic uses OptimConfig.micro_batch_size")
    ]


def test_server_settings_under_the_embedded_engine_are_listed_with_the_reason():
    result = translate(
        [
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ]
    )
    assert "RolloutConfig.engine_options" not in result.bindings
    assert "rlkit's own decode loop" in result.unsupported[0][2]


def test_sglang_gets_no_chunked_prefill_flags_because_verl_gives_it_none():
    result = translate(
        [
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.enable_chunked_prefill=True",
            "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
        ]
    )
    assert "RolloutConfig.engine_options" not in result.bindings
    assert {why for _, _, why in result.unsupported} == {"verl does not pass it to sglang either"}


def test_a_variable_nobody_sets_is_listed_naming_it():
    result = translate(
        overrides_of("python3 -m verl.trainer.main_ppo data.train_files=${TRAIN_FILE}")
    )
    ((key, _, why),) = result.unsupported
    assert key == "data.train_files" and "$TRAIN_FILE" in why and "export it" in why


def test_an_unknown_key_stops_with_the_nearest_one_unless_allowed(tmp_path, capsys):
    args = [
        "from-verl",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_bath_size=8",
    ]
    assert rlkit_main(args) == 2
    err = capsys.readouterr().err
    assert (
        "actor_rollout_ref.actor.ppo_mini_bath_size (did you mean "
        "actor_rollout_ref.actor.ppo_mini_batch_size?)"
        in err
        and "--allow-unknown" in err
    )
    assert rlkit_main([*args, "--allow-unknown"]) == 0
    out = capsys.readouterr().out
    assert (
        "#   actor_rollout_ref.actor.ppo_mini_bath_size = 8: "
        "actor_rollout_ref.actor.ppo_mini_batch_size" in out
    )
    assert "OptimConfig.lr = 1e-06" in out


def test_writing_a_file_prints_the_launch_command_and_the_server_options(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HOME", "/home/u")
    out = tmp_path / "dapo.gin"
    assert rlkit_main(["from-verl", str(DAPO_RECIPE), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"-m rlkit.train {out}" in printed and "--num_processes 32" in printed
    assert "'tp_size': 4" in printed and "1 not translated, 0 unknown" in printed
    assert "ModelConfig.path = '/home/u/verl/models/Qwen2.5-32B'" in out.read_text()


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
    assert "#   trainer.n_gpus_per_node = 1: the 'Run with' command above" in text
    assert f"# Run with: rlkit train {gin_file}" in text
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


def test_if_blocks_are_followed_where_their_test_can_be_read():
    script = """
    mode="async"
    if [ "$mode" = "async" ]; then
        raw_chat="True"
    else
        raw_chat="False"
    fi
    if [ -z "$mode" ]; then tp=1; elif [ "$mode" != "sync" ]; then tp=2; else tp=4; fi
    if nvidia-smi; then gpus=8; fi
    python3 -m verl.trainer.main_ppo data.return_raw_chat=$raw_chat \\
        actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.rollout.tensor_model_parallel_size=$tp trainer.n_gpus_per_node=$gpus
    """
    result = translate(overrides_of(script))
    assert result.bindings["RolloutConfig.engine_options"] == {"tp_size": 2}
    assert ("data.return_raw_chat", "True", "rlkit always keeps the chat messages") in result.used
    ((key, _, why),) = result.unsupported
    assert key == "trainer.n_gpus_per_node" and "`if nvidia-smi`" in why


def test_a_reference_offloaded_unlike_the_actor_is_listed_not_applied():
    result = translate(
        [
            "actor_rollout_ref.actor.fsdp_config.param_offload=False",
            "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        ]
    )
    assert "TrainerConfig.cpu_offload" not in result.bindings
    ((key, _, why),) = result.unsupported
    assert key == "actor_rollout_ref.ref.fsdp_config.param_offload" and "or none" in why


def test_the_overlong_buffer_through_reward_kwargs_is_read_as_the_recipes_buffer():
    # verl's DAPO reward manager also reads its buffer from reward_kwargs (`+` keys).
    result = translate(
        [
            "data.max_response_length=8192",
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
            "+reward_model.reward_kwargs.max_resp_len=8192",
        ]
    )
    b = result.bindings
    assert (
        b["AlgorithmConfig.overlong_buffer_len"],
        b["AlgorithmConfig.overlong_penalty_factor"],
    ) == (4096, 0.5)
    used = {key for key, _, _ in result.used}
    assert "reward_model.reward_kwargs.overlong_buffer_cfg.enable" in used  # as written
    assert "reward_model.reward_kwargs.max_resp_len" in used and not result.unsupported


def test_keys_of_earlier_verl_releases_are_named_with_their_release():
    result = translate(
        [
            "critic.model.fsdp_config.param_offload=False",  # verl <= 0.8: critic.fsdp.*
            "reward_model.micro_batch_size_per_gpu=32",
        ]
    )
    assert not result.unknown
    used = {key: how for key, _, how in result.used}
    assert "critic.model.fsdp_config.param_offload" in used  # read as critic.fsdp.*
    ((key, _, why),) = result.unsupported
    assert key == "reward_model.micro_batch_size_per_gpu" and "a key of verl 0.6.1" in why


def test_rollout_correction_maps_to_rlkits_truncate_or_mask():
    truncate = translate(
        [
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=2.0",
        ]
    ).bindings
    assert truncate["AlgorithmConfig.rollout_is_level"] == "token"
    assert truncate["AlgorithmConfig.rollout_is_threshold"] == 2.0
    icepop = translate(["algorithm.rollout_correction.rollout_is_threshold=0.5_2.0"]).bindings
    assert icepop["AlgorithmConfig.rollout_is_mode"] == "mask"
    assert (
        icepop["AlgorithmConfig.rollout_is_threshold_low"],
        icepop["AlgorithmConfig.rollout_is_threshold"],
    ) == (0.5, 2.0)


def test_a_generation_script_is_refused_naming_rlkit_eval(tmp_path, capsys):
    script = tmp_path / "gen.sh"
    script.write_text("python3 -m verl.trainer.main_generation data.path=x.parquet model.path=m\n")
    assert rlkit_main(["from-verl", str(script)]) == 2
    err = capsys.readouterr().err
    assert "runs verl.trainer.main_generation" in err and "rlkit eval" in err
