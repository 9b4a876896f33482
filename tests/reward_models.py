"""Tiny reward models (a one-label Qwen2 sequence classifier) built locally for tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

SENTENCES = [
    "what is two plus two",
    "the answer is four",
    "let us think step by step",
    "natalia sold clips to her friends",
    "she sold half as many clips in may",
    "how many clips did she sell altogether",
]
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def save_tiny_reward_model(path, *, chat_template: bool, num_labels: int = 1) -> None:
    # A byte-level BPE, the kind Qwen2's tokenizer class rebuilds from the saved
    # files (transformers 5 picks the class from the model type, not the file).
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    if chat_template:
        fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=num_labels,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
