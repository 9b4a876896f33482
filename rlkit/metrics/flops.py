"""Training FLOPs of a decoder-only transformer, counted as verl's ``FlopsCounter`` does.

For a batch of sequences of lengths s_i (prompt + response tokens), one forward and
backward pass costs

    6 · N_dense · Σ_i s_i  +  12 · Σ_i s_i² · head_dim · num_heads · num_layers

where N_dense = num_layers · (attention projections + MLP) + 2 · vocab · hidden: the
q, k, v and output projections (grouped-query attention: k and v have
``num_key_value_heads`` heads), three MLP matrices of hidden × intermediate (gate, up,
down), and the embedding and LM head counted as two vocab × hidden matrices (verl counts
both, tied or not). The first term is the matmuls' 2 FLOPs per multiply-add, times 3
for forward + backward; the second is attention's scores and weighted sum (QKᵀ and AV,
2 · s² · head_dim each per head, forward + backward: × 3), causal masking not
discounted. Norms, activations and the softmax are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def dense_parameters(config: Any) -> int:
    """N_dense of a Hugging Face decoder config (``hidden_size``, ``num_hidden_layers``, …);
    of a vision-language config, its language model's (the vision tower is not counted)."""
    config = _text_config(config)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    intermediate = config.intermediate_size
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o; k and v
    mlp = 3 * hidden * intermediate
    return config.num_hidden_layers * (attention + mlp) + 2 * config.vocab_size * hidden


def training_flops(config: Any, seq_lengths: Iterable[int]) -> float:
    """FLOPs of one forward + backward pass over sequences of ``seq_lengths`` tokens."""
    lengths = [int(s) for s in seq_lengths]
    config = _text_config(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dense = 6 * dense_parameters(config) * sum(lengths)
    attention = 12 * sum(s * s for s in lengths) * head_dim * heads * config.num_hidden_layers
    return float(dense + attention)


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config
