"""verl's knobs under rlkit's names: gen_batch_size, total_epochs, validation sampling
(val_kwargs) and a list of data files."""

from __future__ import annotations

import json

import pytest

from rlkit.train import main as train_main
from rlkit.trainer.config import ExperimentConfig
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment
from tests.gin_files import arithmetic_gin


def _jsonl(path, count, start=0):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(start, start + count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_knobs_reach_the_trainer(tmp_path, tiny_model_dir):
    files = [_jsonl(tmp_path / "a.jsonl", 6), _jsonl(tmp_path / "b.jsonl", 6, start=6)]
    cfg = small_experiment(
        tiny_model_dir,
        tmp_path / "out",
        data={
            "dataset_fn": None,
            "train_files": files,
            "reward": "exact_match",
            "max_prompt_length": 64,
            "gen_batch_size": 8,
        },
        rollout={"val_top_p": 0.5, "val_top_k": 3, "val_temperature": 0.7},
        algorithm={"filter_groups": True, "max_num_gen_batches": 1},
        trainer={"total_epochs": 2, "total_steps": 10, "val_before_train": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        assert len(trainer.train_prompts) == 12  # both files, in order
        assert trainer.train_prompts.ground_truths[:2] == ["1", "2"]
        assert cfg.trainer.total_steps == 2 * 12 // 4  # epochs x prompts // batch
        val = trainer.rollout.sampling(validation=True)
        assert (val.top_p, val.top_k, val.temperature) == (0.5, 3, 0.7)
        train = trainer.rollout.sampling()
        assert (train.top_p, train.top_k) == (1.0, -1)
        trainer.rollout.cfg.rollout.val_do_sample = False
        greedy = trainer.rollout.sampling(validation=True)
        assert (greedy.temperature, greedy.n) == (0.0, 1)
        trainer.step()
        # DAPO: one generation round drew gen_batch_size prompts, not train_batch_size.
        assert trainer.sampler.position == 8
    finally:
        trainer.cleanup()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data": {"gen_batch_size": 2}}, r"gen_batch_size \(2\) must be at least"),
        ({"rollout": {"val_do_sample": False, "val_n": 2}}, "val_n must be 1"),
        ({"rollout": {"val_top_p": 0}}, "RolloutConfig.val_top_p must be"),
        ({"trainer": {"total_epochs": 0}}, "TrainerConfig.total_epochs must be"),
    ],
)
def test_bad_knobs_are_one_message(tmp_path, tiny_model_dir, changes, message):
    cfg: ExperimentConfig = small_experiment(tiny_model_dir, tmp_path, **changes)
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_epochs_and_steps_that_disagree_stop_with_one_message(tmp_path, tiny_model_dir, capsys):
    bindings = {
        "TrainerConfig.total_epochs": 1,
        "TrainerConfig.total_steps": 3,
        "OptimConfig.ppo_mini_batch_size": 4,
        "DataConfig.max_prompt_length": 64,
    }
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "out", bindings))
    assert train_main([str(config)]) == 2
    err = capsys.readouterr().err
    assert "total_epochs = 1 makes 8 steps" in err and "Traceback" not in err


def test_verls_step_and_epoch_counters_are_logged(tmp_path, tiny_model_dir):
    # 6 prompts, 4 per step: step 1 draws from epoch 0, step 2 starts in epoch 0 (2 left)
    # and step 3 starts in epoch 1 (8 of 6 drawn before it).
    cfg = small_experiment(
        tiny_model_dir,
        tmp_path / "out",
        data={
            "dataset_fn": None,
            "train_files": [_jsonl(tmp_path / "a.jsonl", 6)],
            "reward": "exact_match",
            "max_prompt_length": 64,
        },
        trainer={"total_steps": 3, "val_before_train": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        logged = [trainer.step() for _ in range(3)]
    finally:
        trainer.cleanup()
    assert [m["training/global_step"] for m in logged] == [1.0, 2.0, 3.0]
    assert [m["training/epoch"] for m in logged] == [0.0, 0.0, 1.0]
