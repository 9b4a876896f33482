"""Ulysses sequence parallelism on 2 CPU processes (gloo): exact against the unsplit run.

Tolerances: a log-prob, value or gradient element is a chain of float32 sums no longer
than ``reduction_depth`` (tests/numerics.py), so two computations of it differ by at most
``2 gamma_D`` of its magnitude. The split run sums attention over the same keys in
another order (each process attends for its heads over the whole sequence) and adds the
group's partial gradients once more; nothing else changes. Measured: at most 1e-2 of
that bound. A head, token or gradient lost or counted twice moves the result by far more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from algorithms import implicit_prm
from tests.distributed.launch import accelerate_launch, free_port, launch_env
from tests.distributed.test_trainer_two_processes import train_two_processes
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin
from tests.numerics import assert_adam_updates_agree

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_split_forwards_and_gradients_equal_the_unsplit_ones_in_every_family(tmp_path):
    out = tmp_path / "ulysses.json"
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"),
        *("--master_port", str(free_port())),
        *("-m", "tests.distributed.ulysses_checks"),
        str(out),
    ]
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    # 7 families, a one-key/value-head model and gradient checkpointing, each on mixed rows (odd total), rows shorter
    # than k tokens, and one token (process 1 holds only padding).
    assert len(results) == 9 * 3
    expected = {"logp", "entropy", "values", "grads"} | {
        f"loss/{m}"
        for m in (
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        )
    }
    for case, quantities in results.items():
        assert {q.split(" ")[0] for q in quantities} == expected, case
        for quantity, (diff, tol) in quantities.items():
            assert diff <= tol, f"{case} {quantity}: {diff:.3g} > {tol:.3g}"


def _ulysses_run(
    model_dir: Path, out: Path, tmp_path: Path, k: int, preset: str = "ppo", **extra
) -> dict:
    """One step of ``preset`` (PPO: actor, critic, reference) on 2 processes with Ulysses
    size ``k``."""
    bindings = (
        LENGTH_REWARD_RUN
        | extra
        | {
            "ModelConfig.use_remove_padding": True,
            "ModelConfig.ulysses_sequence_parallel_size": k,
            "AlgorithmConfig.use_kl_loss": True,  # a reference pass too
            "OptimConfig.use_dynamic_bsz": True,
            "OptimConfig.max_token_len_per_micro_batch": 48,
            "TrainerConfig.total_steps": 1,
            "TrainerConfig.save_at_end": False,
            "TrainerConfig.export_hf_at_end": True,
            "TrainerConfig.val_before_train": False,
        }
    )
    proc = train_two_processes(arithmetic_gin(model_dir, out, bindings, preset=preset), tmp_path)
    return {"log": proc.stdout + proc.stderr, "metrics": _last_metrics(out)}


def _last_metrics(out: Path) -> dict:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_ppo_step_split_two_ways_equals_the_unsplit_step(demo_model_dir, tmp_path):
    """k = 2 (one data-parallel group) against k = 1 (two), both on 2 processes: the same
    rollouts, so the same losses, values and, after one AdamW step, the same weights."""
    runs = {k: _ulysses_run(demo_model_dir, tmp_path / f"k{k}", tmp_path, k) for k in (1, 2)}
    split, plain = runs[2]["metrics"], runs[1]["metrics"]
    assert "ulysses_sequence_parallel_size: 2 processes split" in runs[2]["log"]
    assert split["critic/score/mean"] == plain["critic/score/mean"]
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/kl_loss",
        "critic/vf_loss",
        "critic/values/mean",
    ):
        assert split[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    weights = {k: load_file(tmp_path / f"k{k}" / "hf_model" / "model.safetensors") for k in (1, 2)}
    before = load_file(Path(demo_model_dir) / "model.safetensors")
    assert any(not torch.equal(before[n], weights[2][n]) for n in before)  # it trained
    assert_adam_updates_agree(weights[2], weights[1], lr=1e-3, steps=1, betas=(0.9, 0.999))


def test_a_prime_step_split_two_ways_equals_the_unsplit_step(demo_model_dir, tmp_path):
    """PRIME: the implicit PRM's scoring forward and its own update split too."""
    runs = {
        k: _ulysses_run(
            demo_model_dir, tmp_path / f"k{k}", tmp_path, k, "prime", **{"PrimeConfig.lr": 1e-3}
        )["metrics"]
        for k in (1, 2)
    }
    assert runs[2]["critic/score/mean"] == runs[1]["critic/score/mean"]
    for key in (
        implicit_prm.METRIC_DPO_LOSS,
        implicit_prm.METRIC_REWARD,
        implicit_prm.METRIC_GRAD_NORM,
        "actor/pg_loss",
        "actor/grad_norm",
    ):
        assert runs[2][key] == pytest.approx(runs[1][key], rel=1e-4, abs=1e-6), key
    assert runs[2][implicit_prm.METRIC_GRAD_NORM] > 0


def test_a_size_that_does_not_divide_the_processes_stops_with_one_message(demo_model_dir, tmp_path):
    bindings = LENGTH_REWARD_RUN | {
        "ModelConfig.use_remove_padding": True,
        "ModelConfig.ulysses_sequence_parallel_size": 4,
    }
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(arithmetic_gin(demo_model_dir, tmp_path / "run", bindings))
    proc = subprocess.run(
        [*accelerate_launch(2), "-m", "rlkit.train", str(cfg)],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "(exitcode: 2)" in proc.stderr, proc.stderr[-3000:]
    assert "ulysses_sequence_parallel_size = 4 does not divide the 2 processes" in proc.stderr
    # One message per process; the only traceback is the launcher's own (ChildFailedError).
    assert not [line for line in proc.stderr.splitlines() if "File " in line and "rlkit/" in line]
