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
