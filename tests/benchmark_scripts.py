"""Load a script of ``benchmarks/`` as a module, for the benchmarks' smoke tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(script: str) -> ModuleType:
    """``benchmarks/<script>`` executed as the module ``benchmark_<its stem>``."""
    spec = importlib.util.spec_from_file_location(
        f"benchmark_{Path(script).stem}", BENCHMARKS / script
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tiniest_workload_argv(tmp_path: Path) -> list[str]:
    """The size flags of ``e2e_grpo_vs_trl.py``'s workload at its tiniest, on a random
    1-layer model built under ``tmp_path``: 2 prompts x 2 completions, <= 3 new tokens."""
    model = load_benchmark("e2e_grpo_vs_trl.py").build_model(
        tmp_path / "model", hidden_size=16, num_layers=1, sft_steps=0
    )
    return [
        "--prompts-per-step", "2", "--group-size", "2", "--max-completion-length", "3",
        "--micro-batch-size", "2", "--num-prompts", "4", "--model-dir", str(model),
    ]  # fmt: skip
