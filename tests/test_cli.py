"""The rlkit command line: listing, and bad configurations failing before any work."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.cli import main
from tests.gin_files import arithmetic_gin
from tests.interrupts import ctrl_c, start_run

ROOT = Path(__file__).resolve().parents[1]


def test_list_prints_every_registered_estimator_and_loss(capsys):
    import algorithms
    import estimators

    assert main(["list", "estimators", "losses"]) == 0
    out = capsys.readouterr().out
    for name in estimators.names() + algorithms.loss_names():
        assert name in out


def test_list_rejects_an_unknown_group(capsys):
    with pytest.raises(SystemExit):
        main(["list", "estimatorz"])
    assert "unknown group" in capsys.readouterr().err


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlkit.train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_misspelt_gin_binding_fails_before_any_work():
    proc = _train("experiments/demo.gin", "--gin_param", "AlgorithmConfig.adv_estimatr = 'rloo'")
    assert proc.returncode != 0
    assert "adv_estimatr" in proc.stderr
    assert "[sft]" not in proc.stdout  # the demo model was not built


def test_unknown_estimator_name_lists_the_known_ones_before_any_work(tmp_path):
    proc = _train(
        "experiments/demo.gin",
        "--gin_param",
        "AlgorithmConfig.adv_estimator = 'grop'",
        "--gin_param",
        f"arithmetic_sft_model.output_dir = '{tmp_path}/m'",
    )
    assert proc.returncode != 0
    assert "Did you mean 'grpo'?" in proc.stderr and "rloo" in proc.stderr
    assert not (tmp_path / "m").exists()  # the demo model was not built


def test_a_bad_configuration_exits_2_with_one_message_naming_every_field(tmp_path):
    proc = _train(
        "experiments/demo.gin",
        "--gin_param",
        "RolloutConfig.max_response_length = 0",
        "--gin_param",
        "OptimConfig.lr = 'fast'",
        "--gin_param",
        f"arithmetic_sft_model.output_dir = '{tmp_path}/m'",
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "rlkit train: invalid experiment configuration:",
        "  - RolloutConfig.max_response_length must be >= 1, got 0",
        "  - OptimConfig.lr must be a finite number >= 0, got 'fast'",
    ]
    assert not (tmp_path / "m").exists()  # failed before the demo model was built


def test_debug_shows_the_traceback_of_a_user_error(tmp_path):
    proc = _train(
        "experiments/demo.gin",
        "--debug",
        "--gin_param",
        "OptimConfig.micro_batch_size = 0",
        "--gin_param",
        f"arithmetic_sft_model.output_dir = '{tmp_path}/m'",
    )
    assert proc.returncode not in (0, 2)
    assert "Traceback" in proc.stderr
    assert "OptimConfig.micro_batch_size must be >= 1, got 0" in proc.stderr


def test_a_bad_gin_file_and_a_missing_model_directory_exit_2(tmp_path):
    proc = _train(str(tmp_path / "missing.gin"))
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        f"rlkit train: config file {str(tmp_path / 'missing.gin')!r} not found",
    )
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(_tiny_gin(tmp_path / "nowhere", tmp_path / "run", 1))
    proc = _train(str(cfg))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "is not a directory; set ModelConfig.path" in proc.stderr.splitlines()[-1]


def _tiny_gin(model, out, steps: int) -> str:
    bindings = {
        "RolloutConfig.n": 2,
        "RolloutConfig.val_n": 1,
        "OptimConfig.ppo_mini_batch_size": 2,
        "TrainerConfig.total_steps": steps,
        "TrainerConfig.tensorboard": False,
    }
    return arithmetic_gin(model, out, bindings)


def test_ctrl_c_during_a_run_exits_130_with_one_line_on_how_to_resume(demo_model_dir, tmp_path):
    import os
    import time

    cfg = tmp_path / "experiment.gin"
    out = tmp_path / "run"
    cfg.write_text(_tiny_gin(demo_model_dir, out, 100000))
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout:
        # -X faulthandler: SIGABRT then prints every thread's stack, should Ctrl-C not stop it
        proc = start_run(
            ["-m", "rlkit.train", str(cfg)],
            stderr_path,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=stdout,
        )
    try:
        # The steps have begun once the validation before RL prints its line (setup,
        # imports and the first validation take longer on a loaded machine).
        deadline = time.monotonic() + 180
        while "before RL:" not in stdout_path.read_text():
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no validation line in 180 s"
            time.sleep(0.1)
        time.sleep(0.5)  # into the first steps
        stderr = ctrl_c(proc, stderr_path, timeout_s=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("rlkit train: interrupted at step "), last
    assert f"no checkpoint in {out} yet" in last and f"rlkit train {cfg}" in last


def test_a_missing_or_bad_data_file_exits_2_with_one_message(demo_model_dir, tmp_path):
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(_tiny_gin(demo_model_dir, tmp_path / "run", 1))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    for path, message in ((tmp_path / "none.jsonl", "no such file"), (bad, "bad.jsonl:1")):
        proc = _train(
            str(cfg),
            "--gin_param",
            "DataConfig.dataset_fn = None",
            "--gin_param",
            f"DataConfig.train_files = '{path}'",
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert message in proc.stderr.splitlines()[-1]
