"""A tiny Qwen2.5-VL built locally: the byte tokenizer with the vision special tokens, a
random ``Qwen2_5_VLForConditionalGeneration`` and its image processor's settings.

It loads as any Qwen2.5-VL directory does (``AutoConfig``, the model class, the tokenizer
and ``AutoImageProcessor``), so the vision-language paths run on it with no hub access.
Images are cut into 14-pixel patches, 2 x 2 of which merge into one image token: a 56 x 56
image is 16 patches and 4 image tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from rlkit.models.tiny import train_byte_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE, TEMPORAL = 14, 2, 2


def vision_tokenizer(corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """:func:`~rlkit.models.tiny.train_byte_tokenizer` plus Qwen2-VL's vision tokens."""
    tokenizer = train_byte_tokenizer(corpus)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tokenizer


def build_tiny_qwen2_5_vl(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_hidden_size: int = 32,
    vision_depth: int = 1,
    max_image_side: int = 56,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Save a random tiny ``Qwen2_5_VLForConditionalGeneration``, its tokenizer and its
    image processor (largest image ``max_image_side`` pixels square) to ``out_dir``.

    Raises:
        ValueError: ``tokenizer`` lacks one of :data:`VISION_TOKENS`.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = tokenizer or vision_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"the tokenizer lacks the vision tokens {missing}; add them first")
    head_dim = hidden_size // num_heads
    # mrope sections split the rotary half-dimension over (time, height, width).
    half = head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 4 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
            },
            "tie_word_embeddings": True,
            **special,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "num_heads": 2,
            "intermediate_size": 2 * vision_hidden_size,
            "out_hidden_size": hidden_size,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL,
            "window_size": max_image_side,
            "fullatt_block_indexes": [vision_depth - 1],
            "in_chans": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        **special,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    side = (max_image_side // (PATCH * MERGE)) * PATCH * MERGE
    Qwen2VLImageProcessorPil(
        min_pixels=(PATCH * MERGE) ** 2,
        max_pixels=side * side,
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=TEMPORAL,
    ).save_pretrained(out)
    return out
