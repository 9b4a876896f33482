"""README command 1's promise: the embedded demo's RL phase raises held-out accuracy
by at least 20 points (absolute), measured over the RL steps, on this CPU; and it still
learns with bf16 compute over float32 weights (``TrainerConfig.mixed_precision``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
KEY = "val/arithmetic/mean@4"


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory) -> Path:
    """One warm-up model for the module: the first run builds it, the next reuses it."""
    return tmp_path_factory.mktemp("demo_sft") / "sft_model"


def run_demo(
    out: Path,
    sft_dir: Path,
    *bindings: str,
    experiment: str = "experiments/demo.gin",
    builder: str = "arithmetic_sft_model",
    key: str = KEY,
) -> list[tuple[int, float]]:
    """``rlkit train EXPERIMENT`` into ``out``, its warm-up model (``builder``) built or
    reused in ``sft_dir``; the held-out accuracy curve (``key``)."""
    command = [sys.executable, "-m", "rlkit.train", experiment]
    for binding in (
        f"TrainerConfig.output_dir = '{out}'",
        f"{builder}.output_dir = '{sft_dir}'",
        "TrainerConfig.progress_bar = False",
        *bindings,
    ):
        command += ["--gin_param", binding]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "before RL:" in proc.stdout and "after RL:" in proc.stdout
    return [(r["step"], r[key]) for r in read_metrics(out / "metrics.jsonl") if key in r]


@pytest.mark.slow
def test_demo_rl_raises_held_out_accuracy_by_20_points(tmp_path, sft_dir):
    out = tmp_path / "demo"
    curve = run_demo(out, sft_dir)
    assert curve[0][0] == 0 and curve[-1][0] == 160 and len(curve) >= 6
    before, after = curve[0][1], curve[-1][1]
    assert after - before >= 0.20, f"held-out accuracy {before:.3f} -> {after:.3f} over RL: {curve}"
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_demo_rl_still_learns_with_bf16_compute(tmp_path, sft_dir):
    # 60 steps, not 160: without native bf16 matrix products a CPU runs the update about
    # 10x slower. On a 2-core AMD EPYC float32 gained 20 points by step 60 (42.2% -> 62.2%)
    # and bf16 21.6 (42.2% -> 63.8%); 12 points leaves room for other CPUs.
    curve = run_demo(
        tmp_path / "demo_bf16",
        sft_dir,
        "TrainerConfig.mixed_precision = 'bf16'",
        "TrainerConfig.total_steps = 60",
    )
    assert [step for step, _ in curve] == [0, 20, 40, 60]
    before, after = curve[0][1], curve[-1][1]
    assert after - before >= 0.12, (
        f"held-out accuracy {before:.3f} -> {after:.3f} under bf16: {curve}"
    )
