"""Resuming a run with another number of processes than saved its checkpoint (2 -> 1 and
1 -> 2, CPU): weights and optimizer state are resharded by torch.distributed.checkpoint;
ranks without a saved RNG state continue from a derived seed, with a warning.

Each test trains step 1 with one process count, resumes step 2 with the other, and checks
that step 2 started from the step-1 checkpoint: one AdamW step per training step
(``ppo_mini_batch_size == train_batch_size``), so the step-2 weights must equal one AdamW
update of the step-1 weights by the step-2 moments (a fresh optimizer or the initial
weights would give other weights and an Adam step count of 1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.distributed.launch import launch_env
from tests.distributed.test_trainer_two_processes import train_two_processes
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8


def train(processes: int, steps: int, model: str, out: Path, tmp_path: Path) -> str:
    """``rlkit train`` to ``steps`` (resuming ``out``'s checkpoint); returns its output."""
    bindings = {
        **LENGTH_REWARD_RUN,
        "TrainerConfig.total_steps": steps,
        "TrainerConfig.max_checkpoints_to_keep": 3,
    }
    text = arithmetic_gin(model, out, bindings)
    if processes == 2:
        proc = train_two_processes(text, tmp_path)
    else:
        cfg = tmp_path / "one.gin"
        cfg.write_text(text)
        command = [sys.executable, "-m", "rlkit.train", str(cfg)]
        proc = subprocess.run(
            command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def full_state(checkpoint: Path, tmp_path: Path) -> dict:
    """The actor's model and optimizer state, gathered from its shards into one process."""
    target = tmp_path / f"{checkpoint.name}.pt"
    dcp_to_torch_save(str(checkpoint / "actor"), str(target))
    return torch.load(target, weights_only=False)


def assert_step_2_continued_step_1(out: Path, tmp_path: Path) -> None:
    one = full_state(out / "checkpoints" / "global_step_1", tmp_path)
    two = full_state(out / "checkpoints" / "global_step_2", tmp_path)
    moved = 0.0
    for name, moments in two["optimizer"]["state"].items():
        assert int(moments["step"]) == 2, name  # the saved optimizer state was loaded
        m, v = moments["exp_avg"].double(), moments["exp_avg_sq"].double()
        denom = (v / (1 - BETAS[1] ** 2)).sqrt() + EPS
        expected = one["model"][name].double() - LR / (1 - BETAS[0] ** 2) * m / denom
        torch.testing.assert_close(two["model"][name].double(), expected, rtol=0, atol=1e-6)
        moved = max(moved, (two["model"][name] - one["model"][name]).abs().max().item())
    assert moved > LR / 2  # step 2 did update the weights


def test_two_process_checkpoint_resumes_with_one_process(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    train(2, 1, demo_model_dir, out, tmp_path)
    log = train(1, 2, demo_model_dir, out, tmp_path)
    assert "resumed_from=" in log
    assert "saved by 2 process(es) and is resumed by 1" in log
    step2 = out / "checkpoints" / "global_step_2"
    assert [p.name for p in step2.glob("rng_rank*.pt")] == ["rng_rank0.pt"]
    assert_step_2_continued_step_1(out, tmp_path)


def test_one_process_checkpoint_resumes_with_two_processes(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    train(1, 1, demo_model_dir, out, tmp_path)
    log = train(2, 2, demo_model_dir, out, tmp_path)
    assert "saved by 1 process(es) and is resumed by 2" in log
    assert "rng_rank1.pt missing" in log  # rank 1 continues from a derived seed
    step2 = out / "checkpoints" / "global_step_2"
    assert sorted(p.name for p in step2.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    assert len(list((step2 / "actor").glob("*.distcp"))) == 2
    assert_step_2_continued_step_1(out, tmp_path)
