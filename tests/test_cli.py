"""The rlkit command line: listing, and bad configurations failing before any work."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.cli import main

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
