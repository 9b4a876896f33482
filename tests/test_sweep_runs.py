"""``rlkit sweep`` end to end: real ``rlkit train`` subprocesses on a tiny model."""

from __future__ import annotations

import csv
import json

import pytest

from rlkit.sweep.cli import main

pytestmark = pytest.mark.slow

# The arithmetic task at test sizes (tests/experiment_factory.py): 4 prompts x 4 responses
# per step, 2 steps, validation on 8 prompts before training and after each step.
TINY_EXPERIMENT = """
ModelConfig.path = "{model}"
DataConfig.dataset_fn = @arithmetic_dataset
arithmetic_dataset.limit = 32
DataConfig.reward = "exact_match"
DataConfig.use_chat_template = False
DataConfig.max_prompt_length = 32
DataConfig.train_batch_size = 4
DataConfig.val_limit = 8
RolloutConfig.n = 4
RolloutConfig.max_response_length = 6
RolloutConfig.val_n = 2
RolloutConfig.val_temperature = 1.0
AlgorithmConfig.use_kl_loss = False
OptimConfig.lr = 1e-3
OptimConfig.ppo_mini_batch_size = 2
OptimConfig.micro_batch_size = 8
TrainerConfig.total_steps = 2
TrainerConfig.test_freq = 1
TrainerConfig.save_at_end = False
TrainerConfig.tensorboard = False
TrainerConfig.plot_learning_curve = False
TrainerConfig.num_threads = 1
"""


@pytest.fixture
def sweep_file(tiny_model_dir, tmp_path):
    (tmp_path / "tiny.gin").write_text(TINY_EXPERIMENT.format(model=tiny_model_dir))
    path = tmp_path / "sweep.gin"
    path.write_text(
        'Sweep.name = "tiny"\n'
        'Sweep.base_configs = ["tiny.gin"]\n'
        # Two real algorithms and one estimator name that does not exist: that run fails.
        'Sweep.grid = {"AlgorithmConfig.adv_estimator": ["grpo", "rloo", "no_such_estimator"]}\n'
        f'Sweep.output_dir = "{tmp_path / "out"}"\n'
        'Sweep.curve_keys = ["critic/score/mean", "val/*"]\n'
    )
    return path


def test_sweep_tabulates_plots_records_failures_and_resumes(sweep_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(sweep_file)]) == 1  # one run failed
    names = ["adv_estimator=grpo", "adv_estimator=rloo", "adv_estimator=no_such_estimator"]

    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run"] for r in rows] == names
    assert [r["status"] for r in rows] == ["completed", "completed", "failed"]
    for row in rows[:2]:
        assert row["steps"] == "2"
        # Validated before training and after each of the 2 steps: 3 values, best >= final.
        final, best = (
            float(row["final val/arithmetic/mean@2"]),
            float(row["best val/arithmetic/mean@2"]),
        )
        assert 0.0 <= final <= best <= 1.0
        assert row["best_step val/arithmetic/pass@2"] in ("0.0", "1.0", "2.0")
    failed = rows[2]
    # An unknown estimator is a user error: rlkit train exits with status 2.
    assert failed["error"] == "exit status 2" and failed["log"].endswith("train.log")
    assert "no_such_estimator" in (out / names[2] / "train.log").read_text()

    markdown = (out / "results.md").read_text()
    assert "2 of 3 runs completed" in markdown
    for name in names:
        assert f"| {name} |" in markdown
    assert "failed (" in markdown and "final mean@2" in markdown

    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for name in names[:2]:
        assert (out / name / "metrics.jsonl").stat().st_size > 0

    # Re-running skips both completed runs (their metrics stay untouched) and retries the failed one.
    stamps = {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in names[:2]}
    capsys.readouterr()
    assert main([str(sweep_file)]) == 1
    printed = capsys.readouterr().out
    assert printed.count("already completed, skipped") == 2
    assert {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in names[:2]} == stamps
    status = json.loads((out / names[2] / "sweep_run.json").read_text())
    assert status["status"] == "failed" and status["returncode"] == 2  # a user error
