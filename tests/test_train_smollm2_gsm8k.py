"""experiments/smollm2_gsm8k.gin trains the real SmolLM2-135M-Instruct on GSM8K for 2 steps on CPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.logging import read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_smollm2_gsm8k_experiment_runs_two_grpo_steps_and_validates(smollm2_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkit.train",
            "experiments/smollm2_gsm8k.gin",
            "--gin_param",
            f"smollm2_model_dir.cache_dir = '{smollm2_dir}'",  # converted already: reused
            "--gin_param",
            f"TrainerConfig.output_dir = '{out}'",
            "--gin_param",
            "TrainerConfig.progress_bar = False",
            "--gin_param",
            "TrainerConfig.num_threads = 1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    steps = [r for r in records if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # 2 prompts x n = 2 responses of at most 32 tokens, scored by the GSM8K reward.
        assert 1 <= r["response_length/max"] <= 32
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"])
        assert r["perf/total_num_tokens"] > 4 * 32  # prompts are GSM8K questions, not toys
    assert any("val/gsm8k/mean@1" in r for r in records), sorted(records[-1])
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
