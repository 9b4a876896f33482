"""Experiment files for tests that run ``rlkit train`` in a subprocess: the tiny arithmetic
task (4 prompts x 4 responses of 6 tokens) with any bindings changed or added."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def arithmetic_gin(
    model: str | Path,
    out: str | Path,
    bindings: dict[str, Any] | None = None,
    *,
    preset: str = "grpo",
) -> str:
    """The text of a gin file: ``presets/<preset>.gin``, the tiny task on ``model`` writing
    to ``out``, then ``bindings`` (``{"OptimConfig.lr": 1e-3}``; a string starting with
    ``@`` is a gin reference, other values are written as Python literals)."""
    lines = {
        "ModelConfig.path": str(model),
        "DataConfig.dataset_fn": "@arithmetic_dataset",
        "arithmetic_dataset.limit": 32,
        "DataConfig.reward": "exact_match",
        "DataConfig.max_prompt_length": 16,
        "DataConfig.train_batch_size": 4,
        "DataConfig.val_limit": 4,
        "RolloutConfig.n": 4,
        "RolloutConfig.max_response_length": 6,
        "RolloutConfig.val_n": 2,
        "TrainerConfig.output_dir": str(out),
        "TrainerConfig.progress_bar": False,
        "TrainerConfig.plot_learning_curve": False,
    } | (bindings or {})
    body = "\n".join(f"{key} = {_literal(value)}" for key, value in lines.items())
    return f"include 'presets/{preset}.gin'\n{body}\n"


def _literal(value: Any) -> str:
    if isinstance(value, str) and value.startswith("@"):
        return value
    return repr(value)


LENGTH_REWARD_RUN = {
    "arithmetic_dataset.limit": 16,
    "DataConfig.reward": "length_penalty",
    "DataConfig.reward_options": {"max_response_length": 6},
    "DataConfig.val_limit": None,
    "RolloutConfig.n": 2,
    "RolloutConfig.val_n": 1,
    "AlgorithmConfig.use_kl_loss": False,
    "OptimConfig.lr": 1e-3,
    "OptimConfig.ppo_mini_batch_size": 4,
    "OptimConfig.micro_batch_size": 4,
}
"""Bindings of checkpoint tests: 16 prompts x 2 responses whose rewards differ by length,
so every step has a gradient."""
