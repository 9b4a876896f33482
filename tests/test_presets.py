"""Every algorithm preset runs a real trainer step through the registries alone."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import gin
import pytest

from rlkit.train import PRESETS_DIR, parse_config
from rlkit.trainer.config import ExperimentConfig
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment

PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.gin"))


def _preset_algorithm(name: str):
    gin.clear_config()
    parse_config([str(PRESETS_DIR / f"{name}.gin")], [])
    try:
        return ExperimentConfig().algorithm
    finally:
        gin.clear_config()


def test_presets_cover_the_advertised_algorithms():
    for name in (
        "ppo",
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "kl_cov",
        "clip_cov",
        "cispo",
    ):
        assert name in PRESETS


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains_one_step(preset, demo_model_dir, tmp_path: Path):
    algorithm = _preset_algorithm(preset)
    if algorithm.overlong_buffer_len == 0 and algorithm.filter_groups:
        algorithm = replace(algorithm, overlong_buffer_len=2)
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / preset,
        trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
    )
    cfg.algorithm = replace(algorithm, max_num_gen_batches=2)
    trainer = RLTrainer(cfg)
    metrics = trainer.run()[-1]
    if metrics.get("train/skipped_step"):  # DAPO may find no varied group in 2 tiny batches
        return
    assert math.isfinite(metrics["actor/pg_loss"])
    assert "critic/advantages/mean" in metrics
    if algorithm.adv_estimator == "gae":
        assert "critic/vf_loss" in metrics and "critic/values/mean" in metrics
    if algorithm.use_kl_in_reward:
        assert "actor/reward_kl_penalty" in metrics
    if algorithm.use_kl_loss:
        assert "actor/kl_loss" in metrics
