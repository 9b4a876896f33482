"""PRIME in the trainer: the implicit PRM is built, scored, updated online and saved."""

from __future__ import annotations

import pytest
import torch

from algorithms import implicit_prm
from rlkit.trainer.config import PrimeConfig
from tests.experiment_factory import small_experiment

PRIME = {
    "adv_estimator": "prime",
    "estimator_options": {"reward_dpo_coef": 5.0, "reward_gt_coef": 5.0},
}


def _prime_experiment(model_dir, out, **prime):
    cfg = small_experiment(
        model_dir,
        out,
        algorithm=PRIME,
        data={"train_batch_size": 4},
        rollout={"n": 4, "temperature": 1.0},
        trainer={"total_steps": 2, "val_before_train": False, "save_at_end": False},
    )
    cfg.prime = PrimeConfig(**{"lr": 1e-3, **prime})
    return cfg


def _prm_params(trainer) -> dict[str, torch.Tensor]:
    backbone = trainer.backend.unwrap(trainer.prm).backbone
    return {n: p.detach().clone() for n, p in backbone.named_parameters()}


@pytest.mark.parametrize(("loss_type", "update"), [("ce", "after"), ("dpo", "reverse")])
def test_prime_steps_score_with_the_prm_then_update_it(demo_model_dir, tmp_path, loss_type, update):
    """Step 1: the PRM is the policy's initialisation, i.e. the reference, so every
    implicit reward beta * (log pi_prm - log pi_ref) of the pre-step PRM is exactly 0
    and the CE loss is log 2 (sigma(0) = 1/2 whatever the outcome). The PRM then moves,
    and step 2's process rewards are not 0."""
    from rlkit.trainer.trainer import RLTrainer

    cfg = _prime_experiment(demo_model_dir, tmp_path, loss_type=loss_type, update=update)
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        start = _prm_params(trainer)
        first = trainer.step()
        moved = _prm_params(trainer)
        second = trainer.step()
    finally:
        trainer.cleanup()
    assert first[implicit_prm.METRIC_RAW_REWARD] == 0.0
    assert first[implicit_prm.METRIC_REWARD] == 0.0
    if loss_type == "ce":
        assert first[implicit_prm.METRIC_DPO_LOSS] == pytest.approx(torch.log(torch.tensor(2.0)))
    assert first[implicit_prm.METRIC_GRAD_NORM] > 0 and first[implicit_prm.METRIC_LR] == 1e-3
    assert max((moved[k] - start[k]).abs().max().item() for k in start) > 1e-4
    assert second[implicit_prm.METRIC_RAW_REWARD] != 0.0
    # after: the accuracies of the update's forward carry verl's _before names.
    acc = implicit_prm.METRIC_DPO_ACC_BEFORE if update == "after" else implicit_prm.METRIC_DPO_ACC
    assert 0.0 <= second[acc] <= 1.0
    assert "timing_s/prm" in second and "timing_s/ref" in second


def test_the_default_order_rewards_with_the_updated_prm(demo_model_dir, tmp_path):
    """update = "before" (verl's default): the PRM steps first and scores again, so already
    step 1's rewards are not 0; the update's own forward (the PRM still equal to the
    reference) gives the *_before accuracies, with a raw reward of 0."""
    from rlkit.trainer.trainer import RLTrainer

    trainer = RLTrainer(_prime_experiment(demo_model_dir, tmp_path))
    trainer.setup()
    try:
        first = trainer.step()
    finally:
        trainer.cleanup()
    assert first[implicit_prm.METRIC_RAW_REWARD] != 0.0
    assert implicit_prm.METRIC_DPO_ACC in first and implicit_prm.METRIC_DPO_ACC_BEFORE in first


def test_a_frozen_prm_keeps_giving_zero_process_rewards(demo_model_dir, tmp_path):
    """update = "none": the PRM never leaves the reference, so the process rewards stay 0
    and only the outcome term moves the policy."""
    from rlkit.trainer.trainer import RLTrainer

    trainer = RLTrainer(_prime_experiment(demo_model_dir, tmp_path, update="none"))
    trainer.setup()
    try:
        start = _prm_params(trainer)
        metrics = [trainer.step(), trainer.step()]
        assert all(torch.equal(start[k], v) for k, v in _prm_params(trainer).items())
    finally:
        trainer.cleanup()
    assert [m[implicit_prm.METRIC_RAW_REWARD] for m in metrics] == [0.0, 0.0]
    assert implicit_prm.METRIC_DPO_LOSS not in metrics[0]


def test_prime_checkpoints_and_resumes_the_prm(demo_model_dir, tmp_path):
    from rlkit.trainer.trainer import RLTrainer

    cfg = _prime_experiment(demo_model_dir, tmp_path)
    cfg.trainer.total_steps, cfg.trainer.save_freq = 1, 1
    trainer = RLTrainer(cfg)
    trainer.run()
    saved = _prm_params(trainer)
    assert (tmp_path / "checkpoints" / "global_step_1" / "prm").is_dir()
    cfg.trainer.total_steps = 1
    again = RLTrainer(cfg)
    again.setup()
    try:
        assert again.resumed_from is not None
        assert all(torch.equal(saved[k], v) for k, v in _prm_params(again).items())
    finally:
        again.cleanup()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("loss_type", "bce", "PrimeConfig.loss_type must be ce|dpo"),
        ("update", "later", "PrimeConfig.update must be before|after|reverse|none"),
        ("beta_train", 0.0, "PrimeConfig.beta_train must be > 0"),
        ("model_path", "no/such/dir", "PrimeConfig.model_path"),
    ],
)
def test_bad_prime_settings_are_named_before_any_work(
    demo_model_dir, tmp_path, field, value, message
):
    cfg = _prime_experiment(demo_model_dir, tmp_path, **{field: value})
    with pytest.raises(ValueError, match=message):
        cfg.validate()
