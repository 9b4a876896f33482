"""Shared fixtures: tiny local models (no hub access anywhere in the suite)."""

from __future__ import annotations

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
