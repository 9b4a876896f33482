"""Tiny random models of every supported family, built locally (no hub).

Each family's configuration keeps the features that make it differ from a plain
decoder (sliding windows, alternating local/global layers, soft-capping, multi-head
latent attention, mixture-of-experts routing, Llama 3.1's rope scaling) at a size that
runs a forward pass in milliseconds: hidden 64, 2 layers, 4 heads, 2 key/value heads,
and the byte tokenizer of :mod:`rlkit.models.tiny`. Windows are :data:`TINY_WINDOW`
tokens, so any rollout longer than a few tokens crosses them.

The suite's model matrix (``tests/test_model_families.py``) runs every family here
through rollout, every training forward and a GRPO step against the model's own eager
forward; ``docs/models.md`` lists what was checked for each.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedTokenizerFast

from rlkit.models.tiny import train_byte_tokenizer

TINY_WINDOW = 4
"""Sliding window of the tiny windowed families, in tokens (query included)."""

_COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}


def _qwen2(window: bool) -> dict[str, Any]:
    # max_window_layers=1: layer 0 attends globally, layer 1 within the window.
    extra = {"use_sliding_window": True, "sliding_window": TINY_WINDOW, "max_window_layers": 1}
    return {"tie_word_embeddings": True, **(extra if window else {})}


#: family -> (config class name, model class name, config fields beyond :data:`_COMMON`).
FAMILIES: dict[str, tuple[str, str, Callable[[], dict[str, Any]]]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", lambda: _qwen2(window=False)),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", lambda: _qwen2(window=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", lambda: {"head_dim": 16}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        lambda: {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
        },
    ),
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        lambda: {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda: {"sliding_window": TINY_WINDOW}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        # Alternating local/global layers and Gemma2's default attention (50) and
        # final-logit (30) soft-capping; caps of 5 and 0.5 bite on a random model's scores.
        lambda: {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": TINY_WINDOW,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 0.5,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        lambda: {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": TINY_WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", lambda: {"sliding_window": TINY_WINDOW}),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        # Multi-head latent attention (key head dim 8 + 8, value head dim 16) and a routed
        # mixture of experts after one dense layer.
        lambda: {
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
        },
    ),
}


SOFTCAP_QUERY_SCALE = 50.0
"""Factor on a soft-capped family's query weights: a random model's attention scores are
far below a cap, where ``c * tanh(s / c)`` equals ``s`` to float rounding; scaled, the
scores reach several times the cap, so an attention path that drops it differs."""


def _sharpen_attention(model: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("q_proj.weight"):
                param.mul_(factor)


def tiny_config(family: str, tokenizer: PreTrainedTokenizerFast) -> Any:
    """The tiny configuration of ``family`` (a key of :data:`FAMILIES`) for ``tokenizer``.

    Raises:
        ValueError: an unknown family (the message lists the known ones).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    config_class, _, extra = FAMILIES[family]
    return getattr(transformers, config_class)(
        **{**_COMMON, **extra()},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_family(
    family: str,
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised tiny ``family`` model and its tokenizer to ``out_dir``.

    Returns the directory, which loads with ``AutoModelForCausalLM.from_pretrained``.
    """
    tokenizer = tokenizer or train_byte_tokenizer()
    config = tiny_config(family, tokenizer)
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[family][1])(config)
    if getattr(config, "attn_logit_softcapping", None):
        _sharpen_attention(model, SOFTCAP_QUERY_SCALE)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
