"""docs/extending.md's worked example runs as written and prints what the page shows."""

from __future__ import annotations

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
