"""Training is a function of the training configuration only: sampled validation (how
often, how many samples, at what temperature) and interrupting a run leave it bitwise
unchanged, because validation draws from its own seeded random stream."""

from __future__ import annotations

import torch

from rlkit.logging import read_metrics
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import LENGTH_REWARD, small_experiment

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def _training(records: list[dict]) -> list[dict]:
    """Per training step, every metric but timings, throughput and validation."""
    return [
        {k: v for k, v in r.items() if not k.startswith((*VOLATILE, "val/"))}
        for r in records
        if "actor/grad_norm" in r
    ]


def _stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def _weights(trainer: RLTrainer) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone() for k, v in trainer.backend.unwrap(trainer.actor).state_dict().items()
    }


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sampled_validation_leaves_training_unchanged(demo_model_dir, tmp_path):
    def run(name: str, **trainer):
        cfg = small_experiment(
            demo_model_dir,
            tmp_path / name,
            data=LENGTH_REWARD,  # nonzero advantages: real updates to compare
            rollout={"val_n": trainer.pop("val_n"), "val_temperature": 1.0},
            trainer={"total_steps": 3, "save_at_end": False, **trainer},
        )
        t = RLTrainer(cfg)
        history = t.run()
        return history, _weights(t)

    validating, w_validating = run("every_step", test_freq=1, val_n=2)
    # No validation before training or in between (only after the last step), other val_n.
    quiet, w_quiet = run("end_only", test_freq=0, val_before_train=False, val_n=3)
    assert "val/arithmetic/mean@2" in validating[0] and "val/arithmetic/mean@2" not in quiet[0]
    assert all(r["actor/grad_norm"] > 0 for r in quiet)
    assert _training(validating) == _training(quiet)
    _assert_same_weights(w_validating, w_quiet)


def test_resume_with_sampled_validation_is_bitwise_identical(demo_model_dir, tmp_path):
    def cfg(name: str, total_steps: int):
        return small_experiment(
            demo_model_dir,
            tmp_path / name,
            data=LENGTH_REWARD,
            trainer={"total_steps": total_steps, "test_freq": 1},  # val_temperature=1.0
        )

    straight = RLTrainer(cfg("straight", 6))
    straight.run()
    RLTrainer(cfg("resumed", 3)).run()  # saves global_step_3 at the end
    resumed = RLTrainer(cfg("resumed", 6))
    resumed.run()
    assert resumed.resumed_from.endswith("global_step_3")
    a = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(7))  # validation before training at step 0
    assert _training(a) == _training(b)
    # Validation is seeded by (seed, rank, step): the same results in both runs too.
    assert _stable(a) == _stable(b)
    _assert_same_weights(_weights(straight), _weights(resumed))
