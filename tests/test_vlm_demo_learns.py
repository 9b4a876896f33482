"""The vision-language demo's promise: RL alone raises the held-out accuracy of naming a
picture's colour by at least 20 points, and the run prints the main demo's lines."""

from __future__ import annotations

import pytest

from tests.test_demo_learns import run_demo


@pytest.mark.slow
def test_vlm_demo_rl_raises_held_out_accuracy_by_20_points(tmp_path):
    curve = run_demo(
        tmp_path / "vlm_demo",
        tmp_path / "sft_model",
        experiment="experiments/vlm_demo.gin",
        builder="colour_sft_model",
        key="val/colour_shapes/mean@4",
    )
    assert [step for step, _ in curve] == [0, 10, 20, 30, 40]
    # Seed 0 on a 2-core Intel Xeon: 47.3% -> 97.3% (the warm-up's noisy labels leave the
    # policy torn between two names, about 50%); 20 points leaves room for other CPUs.
    before, after = curve[0][1], curve[-1][1]
    assert after - before >= 0.20, f"held-out accuracy {before:.3f} -> {after:.3f}: {curve}"
