"""``rlkit sweep`` end to end: real ``rlkit train`` subprocesses on a tiny model, with and
without seeds, interrupted and resumed."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import pytest

from rlkit.logging import read_metrics
from rlkit.sweep.cli import main
from rlkit.sweep.driver import thread_share
from rlkit.sweep.spec import gin_literal

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


# The random tiny model never adds correctly, and with every reward 0 nothing would learn:
# this reward pays half of the responses (by their first character), so runs move apart.
EVEN_FIRST_CHARACTER = """
def reward(response, ground_truth, **extra):
    return float(bool(response) and ord(response[0]) % 2 == 0)
"""


def _seeded_sweep_file(tiny_model_dir, tmp_path):
    (tmp_path / "tiny.gin").write_text(TINY_EXPERIMENT.format(model=tiny_model_dir))
    (tmp_path / "even.py").write_text(EVEN_FIRST_CHARACTER)
    bindings = [
        # A checkpoint after every step, so that an interrupted run has one to resume from.
        "TrainerConfig.save_freq = 1",
        f"DataConfig.reward = {gin_literal(str(tmp_path / 'even.py') + ':reward')}",
    ]
    path = tmp_path / "seeds.gin"
    path.write_text(
        'Sweep.name = "tiny_seeds"\n'
        'Sweep.base_configs = ["tiny.gin"]\n'
        'Sweep.grid = {"AlgorithmConfig.adv_estimator": ["grpo", "rloo"]}\n'
        "Sweep.seeds = [0, 1]\n"
        'Sweep.compare = "adv_estimator=grpo"\n'
        f"Sweep.bindings = {gin_literal(bindings)}\n"
        f'Sweep.output_dir = "{tmp_path / "out"}"\n'
        'Sweep.curve_keys = ["critic/score/mean", "val/*"]\n'
    )
    return path


def _interrupt_when(sweep_file, marker, timeout_s=300.0):
    """Run ``rlkit sweep`` in a process and press Ctrl-C once ``marker`` exists."""
    command = [sys.executable, "-m", "rlkit.cli", "sweep", str(sweep_file)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output


def _value_at(run_dir, key, step):
    return next(
        r[key] for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == step and key in r
    )


def test_seeded_sweep_survives_an_interruption_and_aggregates_seeds(
    tiny_model_dir, tmp_path, capsys
):
    sweep_file, out = _seeded_sweep_file(tiny_model_dir, tmp_path), tmp_path / "out"
    names = [f"adv_estimator={a}_seed={s}" for a in ("grpo", "rloo") for s in (0, 1)]
    # Ctrl-C while the third run (rloo, seed 0) is between its first and its last step.
    code, output = _interrupt_when(sweep_file, out / names[2] / "checkpoints" / "global_step_1")
    assert code == 130, output
    assert [(out / n / "sweep_run.json").is_file() for n in names] == [True, True, False, False]
    stamps = {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in names[:2]}

    # Run again, two at a time: the finished runs are skipped, the third resumes from its
    # checkpoint, the fourth starts; each gets its share of the cores as its thread count.
    assert main([str(sweep_file), "--gin_param", "Sweep.max_parallel = 2"]) == 0
    assert capsys.readouterr().out.count("already completed, skipped") == 2
    assert {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in names[:2]} == stamps
    log = (out / names[2] / "train.log").read_text()
    assert log.count("\n$ ") == 2 and "resumed_from=" in log.split("\n$ ")[2]
    threads = f"TrainerConfig.num_threads = {thread_share(2)}"
    assert threads in (out / names[3] / "train.log").read_text()
    with open(out / names[2] / "metrics.jsonl") as fh:  # every step logged once
        val_steps = [json.loads(line)["step"] for line in fh if "val/arithmetic/mean@2" in line]
    assert val_steps == [0, 1, 2]

    finals = {n: _value_at(out / n, "val/arithmetic/mean@2", 2) for n in names}
    _check_seed_aggregates(out, names, finals)
    _check_paired_differences(out, names, finals)
    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    _check_bad_inputs(sweep_file, out, capsys)


def _check_seed_aggregates(out, names, finals):
    """results_per_seed.csv has every run; results.csv each point's mean, std and interval."""
    key = "val/arithmetic/mean@2"
    with open(out / "results_per_seed.csv", newline="") as fh:
        per_seed = list(csv.DictReader(fh))
    assert [(r["run"], r["point"], r["seed"], r["status"]) for r in per_seed] == [
        (n, n.rsplit("_", 1)[0], n[-1], "completed") for n in names
    ]
    with open(out / "results.csv", newline="") as fh:
        points = list(csv.DictReader(fh))
    assert [(p["point"], p["seeds"], p["completed"]) for p in points] == [
        ("adv_estimator=grpo", "2", "2"), ("adv_estimator=rloo", "2", "2"),
    ]  # fmt: skip
    for point, (a, b) in zip(points, (names[:2], names[2:])):
        # Two seeds: mean (x0 + x1) / 2, std |x0 - x1| / sqrt 2, half width
        # t(0.975, 1) * std / sqrt 2 = 12.706205 * |x0 - x1| / 2.
        mean, spread = (finals[a] + finals[b]) / 2, abs(finals[a] - finals[b])
        assert float(point[f"mean final {key}"]) == pytest.approx(mean)
        assert float(point[f"std final {key}"]) == pytest.approx(spread / 2**0.5)
        assert float(point[f"n final {key}"]) == 2
        high = float(point[f"ci95_high final {key}"])
        assert high == pytest.approx(mean + 12.706205 * spread / 2)


def _check_paired_differences(out, names, finals):
    """What one seed's runs share, and the paired differences at the last common step."""
    key = "val/arithmetic/mean@2"
    # Same seed: same starting model, same prompts and same sampling stream, so the first
    # rollouts (step 1, before any update) and the validation before training are identical.
    for s in (0, 1):
        for metric, step in ((key, 0), ("critic/score/mean", 1)):
            grpo, rloo = out / names[s], out / names[2 + s]
            assert _value_at(grpo, metric, step) == _value_at(rloo, metric, step)
    with open(out / "comparison.csv", newline="") as fh:
        row = {r["metric"]: r for r in csv.DictReader(fh)}[key]
    assert (row["point"], row["baseline"], row["step"], row["n"]) == (
        "adv_estimator=rloo", "adv_estimator=grpo", "2", "2",
    )  # fmt: skip
    differences = [finals[names[2 + s]] - finals[names[s]] for s in (0, 1)]
    assert float(row["mean difference"]) == pytest.approx(sum(differences) / 2)
    markdown = (out / "results.md").read_text()
    assert "4 of 4 runs completed: 2 grid point(s) x seeds 0, 1" in markdown
    for heading in ("## Grid points over seeds", "## Paired differences to adv_estimator=grpo",
                    "## Runs (one per seed)"):  # fmt: skip
        assert heading in markdown
    assert f"| {row['reading']} |" in markdown


def _check_bad_inputs(sweep_file, out, capsys):
    """Each bad input: one message, exit status 2 (the finished runs are not run again)."""
    capsys.readouterr()
    assert main([str(sweep_file), "--gin_param", 'Sweep.compare = "grpo"']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a grid point" in err
    assert "adv_estimator=grpo, adv_estimator=rloo" in err
    assert main([str(sweep_file), "--gin_param", 'Sweep.metrics = ["nope/*"]']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run logged a metric matching" in err and "val/*" in err
    # One seed is no error: the table says there is no interval.
    assert main([str(sweep_file), "--gin_param", "Sweep.seeds = [0]"]) == 0
    assert "(n=1: no interval)" in (out / "results.md").read_text()
