"""The trainer under ``accelerate launch --num_processes 2`` (FSDP2 over gloo) on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import accelerate_launch, launch_env
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

REPO = Path(__file__).resolve().parents[2]

GIN = """
include 'presets/dapo.gin'
ModelConfig.path = "{model}"
DataConfig.dataset_fn = @arithmetic_dataset
arithmetic_dataset.limit = 32
DataConfig.reward = "length_penalty"
DataConfig.reward_options = {{"max_response_length": 6}}
DataConfig.max_prompt_length = 16
DataConfig.train_batch_size = 4
DataConfig.val_limit = 6
RolloutConfig.n = 4
RolloutConfig.max_response_length = 6
RolloutConfig.val_n = 2
RolloutConfig.val_temperature = 1.0
AlgorithmConfig.filter_metric = "score"
AlgorithmConfig.max_num_gen_batches = 2
AlgorithmConfig.overlong_buffer_len = 2
OptimConfig.lr = 1e-3
OptimConfig.ppo_mini_batch_size = 2
OptimConfig.use_dynamic_bsz = True
OptimConfig.max_token_len_per_micro_batch = 40
TrainerConfig.total_steps = 2
TrainerConfig.save_freq = 1
TrainerConfig.output_dir = "{out}"
TrainerConfig.progress_bar = False
"""


def train_two_processes(gin_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``rlkit train`` on ``gin_text`` under ``accelerate launch`` with 2 processes; must exit 0."""
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(gin_text)
    command = [*accelerate_launch(2), "-m", "rlkit.train", str(cfg)]
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=420
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.mark.distributed
@pytest.mark.slow
def test_two_process_dapo_run_trains_logs_and_checkpoints_per_rank(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = train_two_processes(GIN.format(model=demo_model_dir, out=out), tmp_path)
    assert "processes=2" in proc.stdout + proc.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # one writer: the main process only
    last = records[-1]
    assert (
        last["train/num_gen_batches"] >= 1
        and "actor/pg_loss" in last
        or "train/skipped_step" in last
    )
    step = out / "checkpoints" / "global_step_2"
    assert (step / "COMPLETE").exists()
    assert {p.name for p in step.glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    # Sharded checkpoint: every rank wrote its own part of the actor.
    assert len(list((step / "actor").glob("*.distcp"))) == 2


TOOL_GIN = """
include 'presets/grpo.gin'
ModelConfig.path = "{model}"
DataConfig.dataset_fn = @tool_arithmetic_dataset
tool_arithmetic_dataset.limit = 16
DataConfig.reward = "final_turn_match"
DataConfig.max_prompt_length = 48
DataConfig.train_batch_size = 4
DataConfig.val_limit = 4
RolloutConfig.agent_loop = "tool_agent"
RolloutConfig.agent = {{"tools": ["calculator"], "max_turns": 3}}
RolloutConfig.n = 2
RolloutConfig.max_response_length = 120
RolloutConfig.val_n = 1
RolloutConfig.val_temperature = 1.0
AlgorithmConfig.use_kl_loss = False
OptimConfig.ppo_mini_batch_size = 4
OptimConfig.micro_batch_size = 4
TrainerConfig.total_steps = 1
TrainerConfig.save_at_end = False
TrainerConfig.output_dir = "{out}"
TrainerConfig.progress_bar = False
"""


@pytest.mark.distributed
@pytest.mark.slow
def test_two_process_tool_agent_run_keeps_the_processes_in_lock_step(tool_model_dir, tmp_path):
    """Each process's trajectories take their own number of turns and tool calls; the
    continuous batcher's votes keep FSDP's forward passes paired (a miss would hang)."""
    out = tmp_path / "run"
    train_two_processes(TOOL_GIN.format(model=tool_model_dir, out=out), tmp_path)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["step"] == 1 and last["tool_calls/mean"] > 0 and last["num_turns/max"] >= 2
    assert "val/tool_arithmetic/tool_call_rate" in last


def _reward_model_gin(model, reward_model, out) -> str:
    bindings = {
        "RewardModelConfig.path": str(reward_model),
        "RewardModelConfig.max_token_len_per_micro_batch": 40,
        "DataConfig.reward": "reward_model",
        "DataConfig.val_limit": 5,
        "RolloutConfig.val_n": 1,
        "RolloutConfig.val_temperature": 0.0,
        "AlgorithmConfig.use_kl_loss": False,
        "OptimConfig.ppo_mini_batch_size": 4,
        "OptimConfig.micro_batch_size": 8,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.test_freq": 0,
        "TrainerConfig.save_at_end": False,
    }
    return arithmetic_gin(model, out, bindings)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_process_reward_model_scores_equal_one_process_scores(demo_model_dir, tmp_path):
    """The reward model sharded over 2 processes (5 validation prompts: shares of 3 and 2,
    so the processes run their own micro-batches and agree on the count) scores the same
    greedy responses as the unsharded one."""
    from tests.reward_models import save_tiny_reward_model

    rm = tmp_path / "rm"
    save_tiny_reward_model(rm, chat_template=True)
    runs = {}
    for processes in (1, 2):
        out = tmp_path / f"run{processes}"
        text = _reward_model_gin(demo_model_dir, rm, out)
        if processes == 2:
            train_two_processes(text, tmp_path)
        else:
            cfg = tmp_path / "one.gin"
            cfg.write_text(text)
            subprocess.run(
                [sys.executable, "-m", "rlkit.train", str(cfg)], cwd=REPO, check=True, timeout=300
            )
        runs[processes] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    one, two = (runs[p][0]["val/arithmetic/score/mean"] for p in (1, 2))
    assert two == pytest.approx(one, abs=1e-5)
    assert "reward/reward_model/mean" in runs[2][-1]


@pytest.mark.distributed
@pytest.mark.slow
def test_balancing_rows_across_processes_changes_who_computes_not_the_update(
    demo_model_dir, tmp_path
):
    """The same 2-process step with and without ``balance_batch``: the rollouts are the
    same (balancing happens after them), so losses and gradient norms agree to float
    summation order, and the balanced shards are no further apart than contiguous ones."""
    runs = {}
    for balance in (True, False):
        out = tmp_path / f"balance_{balance}"
        bindings = LENGTH_REWARD_RUN | {
            "TrainerConfig.balance_batch": balance,
            "TrainerConfig.total_steps": 1,
            "TrainerConfig.save_at_end": False,
            "TrainerConfig.val_before_train": False,
            "OptimConfig.micro_batch_size": 2,  # several micro-batches per process
        }
        train_two_processes(arithmetic_gin(demo_model_dir, out, bindings), tmp_path)
        runs[balance] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    on, off = runs[True], runs[False]
    assert on["critic/score/mean"] == off["critic/score/mean"]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
    for key in ("global_seqlen/min", "global_seqlen/max", "global_seqlen/mean"):
        assert on[key] == off[key]  # the contiguous split, reported either way
    assert "global_seqlen/balanced_max" not in off
    assert on["global_seqlen/balanced_min"] <= on["global_seqlen/mean"]
    assert on["global_seqlen/mean"] <= on["global_seqlen/balanced_max"] <= on["global_seqlen/max"]


@pytest.mark.distributed
@pytest.mark.slow
def test_shared_prefix_forwards_on_two_processes_give_the_plain_rows_update(
    demo_model_dir, tmp_path
):
    """A 2-process step with each prompt computed once per group (whole groups per process
    and micro-batch) against plain rows: the same losses and gradient norms."""
    runs = {}
    for share in (True, False):
        out = tmp_path / f"share_{share}"
        bindings = LENGTH_REWARD_RUN | {
            "ModelConfig.share_prompt_prefix": share,
            "AlgorithmConfig.use_kl_loss": True,  # a reference pass too
            "TrainerConfig.total_steps": 1,
            "TrainerConfig.save_at_end": False,
            "TrainerConfig.val_before_train": False,
        }
        train_two_processes(arithmetic_gin(demo_model_dir, out, bindings), tmp_path)
        runs[share] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    on, off = runs[True], runs[False]
    assert on["critic/score/mean"] == off["critic/score/mean"]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key


@pytest.mark.distributed
@pytest.mark.slow
def test_fused_adamw_on_two_processes_takes_the_default_optimizers_step(demo_model_dir, tmp_path):
    """PyTorch's fused AdamW kernel on FSDP2's sharded parameters (DTensors over gloo)
    against its default loop: after one optimizer step the weights differ only by float
    rounding, so the second step's rollouts, losses and gradients are the same."""
    runs = {}
    for implementation in ("torch", "fused"):
        out = tmp_path / implementation
        bindings = LENGTH_REWARD_RUN | {
            "OptimConfig.optimizer_implementation": implementation,
            "TrainerConfig.total_steps": 2,
            "TrainerConfig.save_at_end": False,
            "TrainerConfig.val_before_train": False,
        }
        train_two_processes(arithmetic_gin(demo_model_dir, out, bindings), tmp_path)
        runs[implementation] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    fused, default = runs["fused"], runs["torch"]
    assert fused["step"] == default["step"] == 2
    assert fused["critic/score/mean"] == default["critic/score/mean"]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert fused[key] == pytest.approx(default[key], rel=1e-4, abs=1e-6), key
