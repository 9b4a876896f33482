"""docs/extending.md's worked example runs as written and prints what the page shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gin

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "extending.md").read_text()


def _block(lang: str, starts_with: str) -> str:
    for block in re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S):
        if block.lstrip().startswith(starts_with):
            return block
    raise AssertionError(f"no ```{lang} block starting with {starts_with!r} in docs/extending.md")


def _write_package(tmp_path: Path) -> None:
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_module.py").write_text(_block("python", '"""My own advantage estimator'))


def test_python_example_prints_the_documented_output(tmp_path):
    _write_package(tmp_path)
    (tmp_path / "api_demo.py").write_text(_block("python", "import torch\n\nimport algorithms"))
    proc = subprocess.run(
        [sys.executable, "api_demo.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    expected = _block("text", "$ PYTHONPATH=. .venv/bin/python api_demo.py").splitlines()[1:]
    assert proc.stdout.strip().splitlines() == [line for line in expected if line.strip()]


def test_gin_example_resolves_the_custom_estimator_and_loss(tmp_path, monkeypatch):
    from rlkit.train import parse_config
    from rlkit.trainer.config import (
        AlgorithmConfig,
        DataConfig,
        RolloutConfig,
        check_registered_names,
    )

    _write_package(tmp_path)
    (tmp_path / "my_experiment.gin").write_text(_block("gin", "# GRPO's preset with my estimator"))
    monkeypatch.syspath_prepend(str(tmp_path))
    gin.clear_config()
    try:
        parse_config([str(tmp_path / "my_experiment.gin")], [])
        algorithm = AlgorithmConfig()
        assert algorithm.adv_estimator == "mean_abs_dev"
        check_registered_names(algorithm, DataConfig(), RolloutConfig())  # raises if unknown
    finally:
        gin.clear_config()
        from rlkit.registry import ESTIMATORS

        if "mean_abs_dev" in ESTIMATORS:
            ESTIMATORS.unregister("mean_abs_dev")


def test_loss_with_an_extra_input_value_loss_and_extra_info_reward_train_from_user_files(
    tmp_path,
):
    # Everything comes from the page: the user's module, the data script and the gin file.
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_ppo.py").write_text(_block("python", '"""A policy loss that reads the reference'))
    (tmp_path / "make_data.py").write_text(_block("python", '"""Addition problems as a verl'))
    (tmp_path / "my_ppo_experiment.gin").write_text(_block("gin", "# PPO (critic, KL in the"))
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in (["make_data.py"], ["-m", "rlkit.train", "my_ppo_experiment.gin"]):
        proc = subprocess.run(
            [sys.executable, *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "estimator=gae loss=ppo_ref_anchor" in proc.stdout
    lines = (tmp_path / "runs" / "my_ppo_experiment" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert [m["step"] for m in steps] == [1, 2]
    # The declared ref_log_prob arrived: the anchor is 0 while the policy equals the
    # reference and grows once updates have moved it (2 mini-batches per step).
    assert steps[-1]["actor/ref_anchor"] > steps[0]["actor/ref_anchor"] >= 0
    assert steps[-1]["actor/ref_anchor"] > 0
    # The value loss by name: its own metric is logged under critic/.
    assert all("critic/huber_linear_frac" in m and "critic/vf_loss" in m for m in steps)
    # The reward read extra_info on every row (a missing key would count as an error).
    assert all(m["reward/num_errors"] == 0 for m in steps)
    # ... and scores a right answer 1 (the tiny model may answer none right in 2 steps:
    # how many it does depends on the CPU's rounding in its warm-up).
    check = "from my_pkg.my_ppo import sum_from_extra_info as f; print(f(' 7 ', '7', extra_info={'a': 3, 'b': 4}))"
    proc = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert proc.stdout.strip() == "1.0", proc.stderr[-2000:]
