"""Tensor-parallel settings that cannot be honoured stop at configuration time, naming
the setting and the fix; the per-family plans (no processes needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from rlkit.distributed.tensor_parallel import process_count_problem
from rlkit.models.tensor_parallel_plans import (
    TensorParallelPlanError,
    tensor_parallel_plan,
    tensor_parallel_problem,
)
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.config import (
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    RewardModelConfig,
    TrainerConfig,
)
from rlkit.trainer.rollout_source import one_copy_each
from rlkit.trainer.scoring import ScoredRollout
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

REPO = Path(__file__).resolve().parents[1]


def _problems(model_dir: Path, trainer: TrainerConfig | None = None, **model) -> str:
    cfg = ExperimentConfig(
        model=ModelConfig(path=str(model_dir), **model),
        data=DataConfig(train_files="train.jsonl", max_prompt_length=64),
        trainer=trainer or TrainerConfig(),
    )
    with pytest.raises(ValueError) as caught:
        cfg.validate()
    return str(caught.value)


@pytest.fixture(scope="module")
def six_heads(tmp_path_factory) -> Path:
    """6 query heads over 3 key/value heads: split 3 ways, not 2 or 4."""
    out = tmp_path_factory.mktemp("six_heads")
    return build_tiny_qwen2(
        out, train_byte_tokenizer(), hidden_size=96, num_heads=6, num_kv_heads=3
    )


def test_dense_families_split_attention_and_mlp_by_transformers_plan():
    plan = tensor_parallel_plan(transformers.Qwen3Config())
    assert plan["layers.*.self_attn.q_proj"] == "colwise"
    assert plan["layers.*.self_attn.o_proj"] == "rowwise"
    assert plan["layers.*.mlp.down_proj"] == "rowwise"
    assert plan["layers.*.self_attn.q_norm"] == "head_norm"  # sees this process's heads only


def test_mixture_of_experts_keeps_experts_replicated():
    plan = tensor_parallel_plan(transformers.Qwen3MoeConfig())
    assert not [path for path in plan if ".experts" in path]
    assert plan["layers.*.self_attn.k_proj"] == "colwise"


def test_a_family_without_transformers_plan_uses_the_plan_rlkit_writes():
    plan = tensor_parallel_plan(transformers.HunYuanDenseV1Config(head_dim=16))
    assert plan["layers.*.self_attn.query_layernorm"] == "head_norm"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (transformers.Phi3Config(), "fused qkv"),
        (transformers.DeepseekV3Config(), "multi-head latent attention"),
        (transformers.StableLmConfig(), "transformers gives none and rlkit writes none"),
        (transformers.Qwen2_5_VLConfig(), "vision-language model"),
    ],
)
def test_a_family_without_a_plan_is_refused_with_the_fix(config, message):
    with pytest.raises(TensorParallelPlanError, match=message) as caught:
        tensor_parallel_plan(config)
    assert "tensor_parallel_size = 1" in str(caught.value)


def test_sizes_must_divide_heads_key_value_heads_and_processes():
    config = transformers.Qwen2Config(
        num_attention_heads=6, num_key_value_heads=3, intermediate_size=96
    )
    assert tensor_parallel_problem(config, 3) is None
    assert "does not divide the model's 3 key/value heads" in tensor_parallel_problem(config, 2)
    assert "does not divide the model's 6 attention heads" in tensor_parallel_problem(config, 4)
    assert "does not divide the 3 processes" in process_count_problem(2, 3)
    assert process_count_problem(2, 4) is None
    config.intermediate_size = 100
    assert "model's 100 MLP width" in tensor_parallel_problem(config, 3)


def test_settings_tensor_parallelism_cannot_follow_are_named_with_their_fix(six_heads):
    text = _problems(
        six_heads,
        TrainerConfig(rollout_mode="one_step_off"),
        tensor_parallel_size=2,
        lora_rank=4,
        use_remove_padding=True,
        ulysses_sequence_parallel_size=3,
    )
    assert "not both (a 3-D mesh); set one of them to 1" in text
    assert "set lora_rank = 0 or tensor_parallel_size = 1" in text
    assert "rollout_mode = 'sync' only" in text
    assert "does not divide the model's 3 key/value heads" in text


def test_a_reward_model_is_refused(six_heads):
    cfg = ExperimentConfig(
        model=ModelConfig(path=str(six_heads), tensor_parallel_size=3),
        data=DataConfig(train_files="train.jsonl", max_prompt_length=64),
        reward_model=RewardModelConfig(path=str(six_heads)),
    )
    with pytest.raises(ValueError, match="does not split the reward model"):
        cfg.validate()


def test_a_vision_language_policy_is_refused(tmp_path):
    transformers.Qwen2_5_VLConfig().save_pretrained(tmp_path)
    text = _problems(tmp_path, tensor_parallel_size=2)
    assert "no plan for the vision-language model" in text


def test_a_size_above_one_in_a_single_process_run_is_one_message(demo_model_dir, tmp_path):
    bindings = LENGTH_REWARD_RUN | {"ModelConfig.tensor_parallel_size": 2}
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(arithmetic_gin(demo_model_dir, tmp_path / "run", bindings))
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "tensor_parallel_size = 2 does not divide the 1 processes" in proc.stderr
    assert "Traceback" not in proc.stderr


def _rollout(*responses: list[int]) -> ScoredRollout:
    rows = [Trajectory([1], r, [1] * len(r), [0.0] * len(r), [0] * len(r), 0) for r in responses]
    n = len(rows)
    return ScoredRollout(rows, list(range(n)), [0.0] * n, [0.0] * n, ["s"] * n)


def test_a_tensor_parallel_group_keeps_one_copy_of_its_rollout():
    # 4 processes, t = 2: processes 0, 1 generated group 0's rows, 2, 3 group 1's.
    rollouts = [_rollout([5]), _rollout([5]), _rollout([7, 8]), _rollout([7, 8])]
    kept = one_copy_each(rollouts, 2)
    assert [[t.response_ids for t in r.trajectories] for r in kept] == [[[5]], [[7, 8]]]
    # A server engine: only each group's first process generated.
    kept = one_copy_each([_rollout([5]), _rollout(), _rollout([7]), _rollout()], 2)
    assert [len(r) for r in kept] == [1, 1]


def test_a_group_whose_processes_sampled_differently_stops_the_run():
    with pytest.raises(RuntimeError, match="sampled different responses"):
        one_copy_each([_rollout([5]), _rollout([6])], 2)
