"""The vision-language demo's promise: RL alone raises the held-out accuracy of naming a
picture's colour by at least 20 points, and the run prints the main demo's lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
KEY = "val/colour_shapes/mean@4"


@pytest.mark.slow
def test_vlm_demo_rl_raises_held_out_accuracy_by_20_points(tmp_path):
    out = tmp_path / "vlm_demo"
    command = [sys.executable, "-m", "rlkit.train", "experiments/vlm_demo.gin"]
    for binding in (
        f"TrainerConfig.output_dir = '{out}'",
        f"colour_sft_model.output_dir = '{tmp_path / 'sft_model'}'",
        "TrainerConfig.progress_bar = False",
    ):
        command += ["--gin_param", binding]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "before RL:" in proc.stdout and "after RL:" in proc.stdout
    curve = [(r["step"], r[KEY]) for r in read_metrics(out / "metrics.jsonl") if KEY in r]
    assert [step for step, _ in curve] == [0, 10, 20, 30, 40]
    # Seed 0 on a 2-core Intel Xeon: 47.3% -> 97.3% (the warm-up's noisy labels leave the
    # policy torn between two names, about 50%); 20 points leaves room for other CPUs.
    before, after = curve[0][1], curve[-1][1]
    assert after - before >= 0.20, f"held-out accuracy {before:.3f} -> {after:.3f}: {curve}"
