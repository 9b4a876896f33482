"""Tiny causal LMs built locally: a trained byte tokenizer and a random Qwen2.

No hub access is needed, so tests, the embedded demo and SGLang smoke tests can
run anywhere. The tokenizer is a real ``tokenizers`` byte-level BPE model trained
locally and saved as a normal Hugging Face tokenizer directory (``tokenizer.json``), so every consumer that calls
``AutoTokenizer.from_pretrained`` (transformers, SGLang) loads it as usual.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def train_byte_tokenizer(corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with no merges: one token per byte.

    Ids: 0 = ``<pad>``, 1 = ``<s>``, 2 = ``</s>``, then the 256 byte symbols.
    Merges are deliberately disabled: ``AutoTokenizer`` loads a directory whose
    config says ``qwen2`` as ``Qwen2Tokenizer``, which re-applies Qwen's own
    pre-tokenizer (digits split one by one); with no merges both tokenizers give
    identical ids, so transformers, rlkit and SGLang agree token for token.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=3 + len(alphabet),  # specials + bytes: no room for merges
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(corpus or ["0123456789+-*=? abcdefghijklmnopqrstuvwxyz"], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
    )


def build_tiny_qwen2(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised ``Qwen2ForCausalLM`` and its tokenizer to ``out_dir``.

    Returns the directory, which loads with ``AutoModelForCausalLM.from_pretrained``.
    """
    tokenizer = tokenizer or train_byte_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
