"""A vision-language actor's update on image rows under FSDP2 with 2 processes (gloo) equals
the one-process update (``vision_language_checks.py``), packed and padded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from tests.distributed.launch import accelerate_launch, launch_env
from tests.numerics import assert_gradients_close, gamma, reduction_depth

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("vision_language_checks.py")
REPO = Path(__file__).resolve().parents[2]
LR, CLIP = 0.5, 0.05  # vision_language_checks: one clipped SGD step
ROWS, POSITIONS = 4, 32  # its global batch: 4 image rows, under 32 tokens each


def _run(command: list[str], out: Path) -> dict:
    out.mkdir()
    proc = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("result_rank*.json"))]
    grads, params = (torch.load(out / f"{what}.pt") for what in ("grads", "params"))
    return {"ranks": ranks, "grads": grads, "params": params}


@pytest.mark.parametrize(
    "flags",
    [[], ["--remove-padding"], ["--mixed"]],
    ids=["padded", "packed", "one_process_text_only"],
)
def test_two_process_image_update_equals_one_process(vision_model_dir, tmp_path, flags):
    """Gradients within 2 gamma_D of each tensor's largest element (tests/numerics.py, D
    with the vision tower's chain); the clipped SGD step is linear in the gradient and the
    clip factor, so parameters within 2 lr c tol max|g| plus an ulp of |p| per run.
    ``--mixed``: process 1's rows have no image, yet it joins the vision tower's gathers
    (a blank image) and the update is still the one-process one."""
    flags = ["--model", vision_model_dir, *flags]
    two = _run([*accelerate_launch(2), str(SCRIPT), *flags], tmp_path / "two")
    one = _run([sys.executable, str(SCRIPT), *flags], tmp_path / "one")
    assert [r["processes"] for r in two["ranks"]] == [2, 2]
    assert all(r["sharded"] for r in two["ranks"]) and not one["ranks"][0]["sharded"]
    depth = reduction_depth(
        AutoConfig.from_pretrained(vision_model_dir), rows=ROWS, positions=POSITIONS
    )
    tol = 2 * gamma(depth)
    assert any(".visual." in n and g.abs().max() > 0 for n, g in one["grads"].items())
    assert_gradients_close(two["grads"], one["grads"], depth=depth)
    norm = one["ranks"][0]["grad_norm"]
    assert two["ranks"][0]["grad_norm"] == pytest.approx(norm, rel=tol)
    clip = min(1.0, CLIP / (norm + 1e-6))
    g_max = max(g.abs().max().item() for g in one["grads"].values())
    p_max = max(p.abs().max().item() for p in one["params"].values())
    bound = 2 * LR * clip * tol * g_max + 2 * torch.finfo(torch.float32).eps * p_max
    for name, want in one["params"].items():
        assert (two["params"][name] - want).abs().max().item() <= bound, name


def test_a_two_process_image_run_samples_and_trains_in_lock_step(vision_model_dir, tmp_path):
    """A whole ``rlkit train`` step on 2 processes: each generates for its half of the
    image prompts under FSDP (the decode loop and the vision tower in lock step) and
    the trainer's forward reproduces the sampler's log-probs."""
    from tests.distributed.test_trainer_two_processes import train_two_processes
    from tests.gin_files import arithmetic_gin

    out = tmp_path / "run"
    bindings = {
        "DataConfig.dataset_fn": "@colour_dataset",
        "colour_dataset.limit": 16,
        "DataConfig.max_prompt_length": 32,
        "DataConfig.reward": "length_penalty",
        "DataConfig.reward_options": {"max_response_length": 8},
        "RolloutConfig.max_response_length": 8,
        "ModelConfig.use_remove_padding": True,
        "OptimConfig.ppo_mini_batch_size": 4,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.val_before_train": False,
        "TrainerConfig.save_at_end": False,
    }
    gin_text = arithmetic_gin(vision_model_dir, out, bindings).replace(
        "arithmetic_dataset.limit = 32\n", ""
    )
    proc = train_two_processes(gin_text, tmp_path)
    assert "processes=2" in proc.stdout + proc.stderr
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["rollout/logprob_abs_diff_mean"] < 1e-5 and last["actor/grad_norm"] > 0
