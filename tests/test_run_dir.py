"""Run directories: resume only with a compatible configuration, never mix two runs, and
keep ``metrics.jsonl`` one record per step through crashes and resumes."""

from __future__ import annotations

import json

import pytest

from rlkit.logging import MetricsLogger, read_metrics, repair_metrics
from rlkit.trainer.run_dir import RunDirError
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment


def _steps(path) -> list[int]:
    """The step of every line of a metrics file, duplicates included."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_auto_resume_refuses_a_changed_config_and_keeps_segment_configs(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    RLTrainer(small_experiment(demo_model_dir, out, trainer={"total_steps": 1})).run()
    original = (out / "resolved_config.json").read_text(), (out / "config.gin").read_text()

    changed = small_experiment(
        demo_model_dir,
        out,
        optim={"lr": 2e-3},
        rollout={"n": 2},
        trainer={"total_steps": 2, "seed": 1},
    )
    with pytest.raises(ValueError, match="configuration differs") as err:
        RLTrainer(changed).run()
    message = str(err.value)
    assert "OptimConfig.lr: 0.001 -> 0.002" in message
    assert "RolloutConfig.n: 4 -> 2" in message
    assert "TrainerConfig.seed: 0 -> 1" in message
    assert "total_steps: 1 -> 2" not in message.split("Fields that may change")[0]

    # Allowed changes: longer, validating every step, another val_n.
    longer = small_experiment(
        demo_model_dir,
        out,
        rollout={"val_n": 3},
        trainer={"total_steps": 2, "test_freq": 1},
    )
    trainer = RLTrainer(longer)
    trainer.run()
    assert trainer.resumed_from.endswith("global_step_1")
    assert any("TrainerConfig.total_steps: 1 -> 2" in c for c in trainer.resume_changes)
    assert ((out / "resolved_config.json").read_text(), (out / "config.gin").read_text()) == (
        original
    )
    segment = json.loads((out / "resolved_config.resume_step_1.json").read_text())
    assert segment["trainer"]["total_steps"] == 2
    assert (out / "config.resume_step_1.gin").exists()
    assert _steps(out / "metrics.jsonl") == [0, 1, 2]

    with pytest.warns(UserWarning, match="nothing to train"):  # finished: says so
        RLTrainer(longer).run()
    assert _steps(out / "metrics.jsonl") == [0, 1, 2]


def test_disable_refuses_a_used_directory_unless_overwrite(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    fresh = {"total_steps": 1, "resume_mode": "disable"}
    RLTrainer(small_experiment(demo_model_dir, out, trainer=fresh)).run()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="overwrite=True"):
        RLTrainer(small_experiment(demo_model_dir, out, trainer=fresh)).run()
    assert _steps(out / "metrics.jsonl") == [0, 1]

    again = small_experiment(
        demo_model_dir, out, trainer={**fresh, "overwrite": True, "val_before_train": False}
    )
    trainer = RLTrainer(again)
    trainer.run()
    assert trainer.resumed_from is None
    assert _steps(out / "metrics.jsonl") == [1]  # the old run's records are gone
    assert [p.name for p in (out / "checkpoints").glob("global_step_*")] == ["global_step_1"]
    assert (out / "notes.txt").read_text() == "mine"  # not a run output: kept


def test_resume_repairs_a_truncated_metrics_file_and_drops_relogged_steps(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    cfg = small_experiment(demo_model_dir, out, trainer={"total_steps": 2, "save_freq": 1})
    RLTrainer(cfg).run()
    # A crash in step 3's write after checkpoint 1 was the latest: the run resumes at 1.
    ckpts = out / "checkpoints"
    (ckpts / "latest").write_text("global_step_1")
    (ckpts / "global_step_2" / "COMPLETE").unlink()
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "actor/pg_lo')
    with pytest.warns(UserWarning) as warned:
        trainer = RLTrainer(cfg)
        trainer.run()
    text = " ".join(str(w.message) for w in warned)
    assert "incomplete last line" in text and "dropped 1 record" in text
    assert trainer.resumed_from.endswith("global_step_1")
    assert _steps(out / "metrics.jsonl") == [0, 1, 2]


def test_repair_metrics_keeps_complete_records_up_to_the_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "a": 1}\n{"step": 2, "b"')
    with pytest.warns(UserWarning, match="incomplete last line"):
        repair_metrics(path, keep_through_step=2)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n{"step": 2, "a": 1}\n'
    with pytest.warns(UserWarning, match="dropped 2 record"):
        repair_metrics(path, keep_through_step=0)
    assert path.read_text() == '{"step": 0}\n'
    repair_metrics(path, keep_through_step=0)  # nothing to do: no warning, no rewrite
    assert path.read_text() == '{"step": 0}\n'


def test_metrics_logger_writes_each_record_in_one_write(tmp_path, monkeypatch):
    logger = MetricsLogger(tmp_path, total_steps=1, tensorboard=False, progress_bar=False)
    writes: list[bytes] = []
    real = logger._jsonl.write
    monkeypatch.setattr(logger._jsonl, "write", lambda b: writes.append(b) or real(b))
    logger.log({f"m/{i}": float(i) for i in range(2000)}, step=1)  # > any buffer size
    logger.close()
    assert len(writes) == 1 and writes[0].endswith(b"\n")
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["m/1999"] == 1999.0


def test_a_failing_learning_curve_plot_warns_and_the_run_succeeds(
    demo_model_dir, tmp_path, monkeypatch
):
    import rlkit.logging

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rlkit.logging, "plot_run_dashboard", broken)
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        trainer={"total_steps": 1, "save_at_end": False, "plot_learning_curve": True},
    )
    with pytest.warns(UserWarning, match="learning_curve.png not written"):
        history = RLTrainer(cfg).run()
    assert len(history) == 1


def test_a_field_the_saved_run_lacked_counts_as_changed_only_off_its_default(tiny_model_dir):
    # A run saved by an older rlkit has no entry for a newer field: at its default the
    # field changes nothing; set to something else it is a change like any other.
    import json

    from rlkit.trainer.config import ExperimentConfig, ModelConfig
    from rlkit.trainer.run_dir import config_differences, config_json

    cfg = ExperimentConfig(model=ModelConfig(path=tiny_model_dir))
    saved = json.loads(config_json(cfg))
    del saved["trainer"]["export_freq"]
    assert config_differences(saved, cfg) == []
    cfg.trainer.export_freq = 5
    assert config_differences(saved, cfg) == ["TrainerConfig.export_freq: '<absent>' -> 5"]
