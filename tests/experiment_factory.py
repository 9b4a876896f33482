"""Small, fast experiment configurations on the arithmetic task for trainer tests."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

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


@dataclass
class StepRun:
    """What one ``RLTrainer.step()`` did to the actor (see :func:`run_one_step`)."""

    metrics: dict[str, float]
    grads: list[dict[str, torch.Tensor]]
    """Per optimizer step, the gradients it consumed (accumulated and clipped), by name."""
    initial: dict[str, torch.Tensor]
    """The actor backbone's parameters before the step."""
    params: dict[str, torch.Tensor]
    """... and after it."""
    model_config: Any
    cfg: ExperimentConfig


def run_one_step(cfg: ExperimentConfig, prepare: Callable[[Any], None] | None = None) -> StepRun:
    """Set up an ``RLTrainer``, run one step, record gradients and parameters, clean up.

    ``prepare(trainer)`` runs after ``setup()``, before the step. Gradients are recorded by a
    ``torch.optim`` step pre-hook (tests/numerics.py), so the trainer is used unmodified.
    With ``OptimConfig.lr = 0`` the parameters never move: every mini-batch's gradient is
    then taken at the same point whatever happened before it, in any run.
    """
    from rlkit.trainer.trainer import RLTrainer
    from tests.numerics import optimizer_step_gradients

    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        if prepare is not None:
            prepare(trainer)
        backbone = trainer.backend.unwrap(trainer.actor).backbone
        initial = {n: p.detach().clone() for n, p in backbone.named_parameters()}
        with optimizer_step_gradients(backbone) as grads:
            metrics = trainer.step()
        params = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    finally:
        trainer.cleanup()
    return StepRun(metrics, grads, initial, params, backbone.config, cfg)


# A reward that differs between a group's responses whatever the model answers (their
# lengths differ), so every step has nonzero advantages and a nonzero gradient.
LENGTH_REWARD = {"reward": "length_penalty", "reward_options": {"max_response_length": 6}}


def step_reduction_depth(run: StepRun) -> int:
    """``D`` (tests/numerics.py) of one optimizer step of ``run``: a whole mini-batch's rows
    at the longest prompt plus response the experiment allows."""
    from tests.numerics import reduction_depth

    c = run.cfg
    return reduction_depth(
        run.model_config,
        rows=c.optim.ppo_mini_batch_size * c.rollout.n,
        positions=c.data.max_prompt_length + c.rollout.max_response_length,
    )


def assert_same_gradients(run: StepRun, ref: StepRun) -> None:
    """Two code paths gave the optimizer the same gradients and reported the same loss.

    Meant for runs with ``lr = 0`` (every mini-batch's gradient at the same parameters).
    Tolerance ``2 gamma_D`` (tests/numerics.py; ~1.7e-4 for the demo model): of each
    tensor's largest gradient element; of the grad norm; for ``pg_loss``, a sum of
    advantage-weighted ratios (1 up to rounding on this policy), of the largest advantage.
    """
    from tests.numerics import assert_gradients_close, gamma

    depth = step_reduction_depth(ref)
    tol = 2 * gamma(depth)
    assert ref.metrics["actor/grad_norm"] > 0  # a real gradient, not zero against zero
    assert len(run.grads) == len(ref.grads) > 0
    for got, want in zip(run.grads, ref.grads):
        assert_gradients_close(got, want, depth=depth)
    m, r = run.metrics, ref.metrics
    adv = max(abs(r["critic/advantages/max"]), abs(r["critic/advantages/min"]))
    assert m["actor/pg_loss"] == pytest.approx(r["actor/pg_loss"], rel=tol, abs=tol * adv)
    assert m["actor/grad_norm"] == pytest.approx(r["actor/grad_norm"], rel=tol)


def assert_same_adam_update(run: StepRun, ref: StepRun) -> None:
    """Two code paths' parameters after the same AdamW steps from the same start agree as
    far as Adam's sign-like steps allow (tests/numerics.py), and the update was applied."""
    from tests.numerics import assert_adam_updates_agree

    o = ref.cfg.optim
    assert o.lr > 0 and len(run.grads) == len(ref.grads) > 0
    assert all(torch.equal(run.initial[k], ref.initial[k]) for k in ref.initial)
    moved = max((ref.params[k] - ref.initial[k]).abs().max().item() for k in ref.params)
    assert moved > o.lr / 2  # the update was applied
    assert_adam_updates_agree(
        run.params,
        ref.params,
        lr=o.lr,
        steps=len(ref.grads),
        betas=tuple(o.betas),
        weight_decay=o.weight_decay,
    )
