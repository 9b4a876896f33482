"""README command 1's promise: the embedded demo's RL phase raises held-out accuracy
by at least 20 points (absolute), measured over the RL steps, on this CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
KEY = "val/arithmetic/mean@4"


@pytest.mark.slow
def test_demo_rl_raises_held_out_accuracy_by_20_points(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkit.train",
            "experiments/demo.gin",
            "--gin_param",
            f"TrainerConfig.output_dir = '{out}'",
            "--gin_param",
            f"arithmetic_sft_model.output_dir = '{out}/sft_model'",
            "--gin_param",
            "TrainerConfig.progress_bar = False",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "before RL:" in proc.stdout and "after RL:" in proc.stdout
    curve = [(r["step"], r[KEY]) for r in read_metrics(out / "metrics.jsonl") if KEY in r]
    assert curve[0][0] == 0 and curve[-1][0] == 160 and len(curve) >= 6
    before, after = curve[0][1], curve[-1][1]
    assert after - before >= 0.20, f"held-out accuracy {before:.3f} -> {after:.3f} over RL: {curve}"
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
