"""Batch-job logs: with standard output not a terminal, ``rlkit train`` prints one
``step:N - key:value`` line per step (numbered as metrics.jsonl), and a DAPO run that never
updates stops with one message."""

from __future__ import annotations

import json

from rlkit.logging.trackers import step_line
from rlkit.train import main as train_main
from tests.gin_files import arithmetic_gin

BINDINGS = {
    "TrainerConfig.progress_bar": True,  # the console sink: lines, since stdout is captured
    "TrainerConfig.total_steps": 1,
    "TrainerConfig.val_before_train": False,
    "TrainerConfig.save_at_end": False,
    "OptimConfig.ppo_mini_batch_size": 4,
    "DataConfig.val_limit": None,
    "DataConfig.max_prompt_length": 64,
}


def _steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()]


def test_step_line_names_every_metric_key_metrics_first():
    line = step_line({"b/x": 2.0, "actor/pg_loss": 0.5, "critic/score/mean": 1.0}, 3)
    assert line == "step:3 - critic/score/mean:1 - actor/pg_loss:0.5 - b/x:2"


def test_a_batch_job_gets_one_line_per_step(tmp_path, tiny_model_dir, capfd):
    bindings = BINDINGS | {
        "DataConfig.reward": "length_penalty",
        "DataConfig.reward_options": {"max_response_length": 6},
    }
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "out", bindings))
    assert train_main([str(config)]) == 0
    printed = capfd.readouterr()
    lines = [line for line in printed.out.splitlines() if line.startswith("step:")]
    assert len(lines) == 1 and lines[0].startswith("step:1 - critic/score/mean:")
    assert " - actor/pg_loss:" in lines[0]
    assert _steps(tmp_path / "out") == [1]
    assert "\r" not in printed.out + printed.err.replace("\rLoading", "")  # no bar


def test_a_dapo_run_that_never_updates_stops_with_one_message(tmp_path, tiny_model_dir, capfd):
    bindings = BINDINGS | {
        "DataConfig.reward": "zero",  # every group's score is constant: all filtered
        "AlgorithmConfig.filter_groups": True,
        "AlgorithmConfig.filter_metric": "score",
        "AlgorithmConfig.max_num_gen_batches": 2,
    }
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "out", bindings, preset="dapo"))
    assert train_main([str(config)]) == 2
    printed = capfd.readouterr()
    # The skip line numbers the step as metrics.jsonl does.
    assert "step 1: no group with varied score after 2 generation batches" in printed.out
    assert _steps(tmp_path / "out") == [1]
    assert "step:1 - " in printed.out and "train/skipped_step:1" in printed.out
    last = printed.err.strip().splitlines()[-1]
    assert last.startswith("rlkit train: no step of the run updated the model")
    assert "max_num_gen_batches = 2" in last
    # The skipped step still logs what was generated: zero scores, real lengths.
    record = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["critic/score/mean"] == 0.0 and record["critic/acc/mean"] == 0.0
    assert 1 <= record["response_length/mean"] <= record["response_length/max"]
    assert (record["training/global_step"], record["training/epoch"]) == (1.0, 0.0)
