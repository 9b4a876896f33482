"""Small, fast experiment configurations on the arithmetic task for trainer tests."""

from __future__ import annotations

import functools
from dataclasses import replace

from rlkit.tasks.arithmetic import arithmetic_dataset
from rlkit.trainer.config import (
    AlgorithmConfig,
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
)


def small_experiment(model_dir: str, out_dir: str, **sections: dict) -> ExperimentConfig:
    """4 prompts x 4 responses per step, 6-token responses, 2 steps; override per section."""
    cfg = ExperimentConfig(
        model=ModelConfig(path=str(model_dir)),
        data=DataConfig(
            dataset_fn=functools.partial(arithmetic_dataset, limit=32),
            reward="exact_match",
            max_prompt_length=16,
            train_batch_size=4,
            val_limit=8,
        ),
        rollout=RolloutConfig(n=4, max_response_length=6, val_n=2, val_temperature=1.0),
        algorithm=AlgorithmConfig(use_kl_loss=False),
        optim=OptimConfig(lr=1e-3, ppo_mini_batch_size=2, micro_batch_size=3),
        trainer=TrainerConfig(
            total_steps=2,
            test_freq=0,
            output_dir=str(out_dir),
            progress_bar=False,
            plot_learning_curve=False,
        ),
    )
    for name, fields in sections.items():
        setattr(cfg, name, replace(getattr(cfg, name), **fields))
    return cfg
