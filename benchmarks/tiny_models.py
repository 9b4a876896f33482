"""The random Qwen2 decoder the decode, memory, sequence-parallel and GPU-check
benchmarks time: built in memory, with no tokenizer and nothing on disk.

Benchmarks that need a loadable directory with a tokenizer (a server loads it, or the
trainer does) use :func:`rlkit.models.tiny.build_tiny_qwen2` instead.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def random_qwen2(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    device: str | torch.device | None = None,
    attn_implementation: str | None = None,
    **config: Any,
) -> torch.nn.Module:
    """A randomly initialised float32 ``Qwen2ForCausalLM``, in train mode.

    Args:
        vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
            max_position_embeddings, tie_word_embeddings: the decoder's shape.
        seed: torch's generator is seeded with it first, so the same sizes give the same
            weights on every call and in every process.
        device: where the weights are initialised (``None``: torch's default device); a
            large model is built directly on the accelerator, not copied there.
        attn_implementation: the attention the model runs (``None``: transformers').
        **config: further ``Qwen2Config`` fields (``rope_theta``, ``pad_token_id``, ...).
    """
    # Imported on first use: the parent processes of hf_engine_memory.py and ulysses.py
    # only launch workers and never need transformers.
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    qwen2 = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **config,
    )
    if attn_implementation is not None:
        qwen2._attn_implementation = attn_implementation
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return Qwen2ForCausalLM(qwen2)
