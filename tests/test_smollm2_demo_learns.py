"""experiments/smollm2_demo.gin's promise: RL alone, with no supervised warm-up, raises the
held-out accuracy of the real SmolLM2-135M-Instruct on small addition questions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
KEY = "val/small_arithmetic/mean@4"
STEPS = 4


@pytest.mark.slow
def test_smollm2_demo_rl_raises_held_out_accuracy(smollm2_dir, tmp_path):
    out = tmp_path / "smollm2_demo"
    command = [sys.executable, "-m", "rlkit.train", "experiments/smollm2_demo.gin"]
    for binding in (
        f"smollm2_model_dir.cache_dir = '{smollm2_dir}'",  # converted already: reused
        f"TrainerConfig.output_dir = '{out}'",
        "TrainerConfig.progress_bar = False",
        f"TrainerConfig.total_steps = {STEPS}",
        "TrainerConfig.test_freq = 0",
    ):
        command += ["--gin_param", binding]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "before RL:" in proc.stdout and "after RL:" in proc.stdout
    records = [r for r in read_metrics(out / "metrics.jsonl") if KEY in r]
    assert [r["step"] for r in records] == [0, STEPS]
    before, after = records
    # Seed 0 on a 2-core AMD EPYC: 11.9% [7.7, 16.0] -> 59.4% [52.7, 66.1] after 4 steps
    # (65.0-65.9% after 5); seed 1 under bf16 compute, the smallest gain measured:
    # 11.2% [6.9, 15.6] -> 49.1% [42.1, 56.1] after 4 steps. Asked: +20 points, and the
    # after-RL interval's lower end above the before-RL interval's end.
    gain = after[KEY] - before[KEY]
    assert gain >= 0.20, f"held-out accuracy {before[KEY]:.3f} -> {after[KEY]:.3f}"
    assert after[f"{KEY}_ci_low"] > before[f"{KEY}_ci_high"], (before, after)
