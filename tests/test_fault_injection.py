"""A run killed with SIGKILL at seeded moments, resumed each time, ends as an uninterrupted one.

The kills land at a seeded schedule of moments: while a checkpoint is being written
(the moment its temporary directory appears), after a seeded number of logged steps,
and after a seeded delay. Each time
the same command resumes from the latest complete checkpoint. At the end the
metrics (timings aside) and the final weights equal those of a run never killed,
and no step is logged twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.gin_files import arithmetic_gin

REPO = Path(__file__).resolve().parents[1]

BINDINGS = {
    "RolloutConfig.val_temperature": 1.0,
    "AlgorithmConfig.use_kl_loss": False,
    "OptimConfig.lr": 1e-3,
    "OptimConfig.ppo_mini_batch_size": 2,
    "OptimConfig.micro_batch_size": 4,
    "TrainerConfig.total_steps": 5,
    "TrainerConfig.test_freq": 2,
    "TrainerConfig.save_freq": 1,
    "TrainerConfig.max_checkpoints_to_keep": 2,
    "TrainerConfig.num_threads": 1,
    "TrainerConfig.export_hf_at_end": True,
}


def _command(cfg: Path) -> list[str]:
    return [sys.executable, "-m", "rlkit.train", str(cfg)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _run_with_kill(cfg: Path, out: Path, moment: tuple[str, float]) -> bool:
    """Start the run and SIGKILL it at ``moment``; return whether it was killed (False: it
    finished first)."""
    kind, value = moment
    proc = subprocess.Popen(
        _command(cfg), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    start = time.monotonic()
    checkpoints = out / "checkpoints"
    while proc.poll() is None:
        elapsed = time.monotonic() - start
        if _due(kind, value, elapsed, out, checkpoints) or elapsed > 240:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    assert proc.returncode == 0, proc.stderr.read().decode()[-3000:]
    return False


def _due(kind: str, value: float, elapsed: float, out: Path, checkpoints: Path) -> bool:
    if kind == "delay":
        return elapsed >= value
    if kind == "checkpoint":  # its temporary directory exists: a write is in progress
        return any(checkpoints.glob(".tmp-global_step_*"))
    metrics = out / "metrics.jsonl"  # "records": after that many logged records
    return metrics.exists() and metrics.read_text().count("\n") >= value


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing", "perf/"))}


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(out / "hf_model").state_dict())


@pytest.mark.slow
def test_kill_nine_at_seeded_moments_then_resume_equals_an_uninterrupted_run(
    demo_model_dir, tmp_path
):
    rng = random.Random(1234)
    # Kills while a checkpoint is written, after a seeded number of logged records (in
    # the middle of a step's work), and after a seeded delay (during start-up).
    schedule = [
        ("checkpoint", 0.0),
        ("records", rng.randint(1, 3)),
        ("checkpoint", 0.0),
        ("delay", rng.uniform(2.0, 6.0)),
        ("records", rng.randint(4, 5)),
    ]

    straight, resumed = tmp_path / "straight", tmp_path / "killed"
    for out in (straight, resumed):
        (tmp_path / f"{out.name}.gin").write_text(arithmetic_gin(demo_model_dir, out, BINDINGS))
    subprocess.run(
        _command(tmp_path / "straight.gin"), cwd=REPO, env=_env(), check=True, timeout=600
    )

    kills = sum(_run_with_kill(tmp_path / "killed.gin", resumed, m) for m in schedule)
    assert kills >= 3  # the schedule really interrupted the run
    for _ in range(3):  # finish: the latest complete checkpoint onwards
        done = subprocess.run(_command(tmp_path / "killed.gin"), cwd=REPO, env=_env(), timeout=600)
        if done.returncode == 0 and (resumed / "hf_model").exists():
            break
    assert (resumed / "hf_model").exists()

    got, want = _records(resumed), _records(straight)
    steps = [r["step"] for r in got]
    assert steps == sorted(set(steps)), steps  # no step logged twice, in order
    assert [_comparable(r) for r in got] == [_comparable(r) for r in want]
    a, b = _final_weights(resumed), _final_weights(straight)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
