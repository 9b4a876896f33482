"""The embedded demo task: two-digit addition, learnable on a CPU in minutes.

Prompts are ``"a+b="`` and the answer is the decimal sum followed by EOS. Train
and held-out prompts are disjoint (a, b) pairs. The demo first builds a tiny
Qwen2 and warms it up with supervised learning on *noisy* demonstrations (a
fraction of the answers are wrong by a small offset), so the policy knows the
format and roughly how to add but samples wrong answers often; RL with the
exact-match reward then has to find out which answers are right.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import gin
import torch

from rlkit.tasks.warmup import cached, fresh_model, publish, right_padded, supervised_warmup

#: Renders chat messages as their bare contents, so the prompt is exactly "a+b=".
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
DATA_SOURCE = "arithmetic"


def _is_held_out(a: int, b: int) -> bool:
    # A fixed 20% of all pairs, chosen by a hash so the split never depends on a seed.
    return int(hashlib.sha256(f"{a}+{b}".encode()).hexdigest(), 16) % 5 == 0


def addition_pairs(split: str, *, max_operand: int = 99) -> list[tuple[int, int]]:
    """All (a, b) with 0 <= a, b <= max_operand in ``split`` (train | val)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train or val, got {split!r}")
    held = split != "train"
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    return [p for p in pairs if _is_held_out(*p) == held]


@gin.configurable
def arithmetic_dataset(
    split: str, *, max_operand: int = 99, limit: int | None = None, seed: int = 0
):
    """The task as a prompt-schema ``datasets.Dataset`` (id, prompt, ground_truth, data_source).

    Args:
        split: ``train`` or ``val``.
        max_operand: operands are drawn from 0..max_operand.
        limit: keep only the first ``limit`` rows of the seeded shuffle (a random subset).
    """
    from datasets import Dataset

    pairs = addition_pairs(split, max_operand=max_operand)
    # A seeded shuffle, so that any prefix (DataConfig.val_limit) is a random subset.
    random.Random(seed).shuffle(pairs)
    if limit is not None:
        pairs = pairs[:limit]
    return Dataset.from_list(
        [
            {
                "id": f"add-{a}-{b}",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ground_truth": str(a + b),
                "data_source": DATA_SOURCE,
            }
            for a, b in pairs
        ]
    )


def _noisy_answer(
    a: int, b: int, rng: random.Random, noise: float, offsets: tuple[int, ...]
) -> str:
    if rng.random() >= noise:
        return str(a + b)
    return str(abs(a + b + rng.choice(offsets)))


@gin.configurable
def arithmetic_sft_model(
    output_dir: str = "runs/demo/sft_model",
    *,
    steps: int = 1500,
    batch_size: int = 128,
    lr: float = 3e-3,
    label_noise: float = 0.5,
    wrong_offsets: tuple[int, ...] = (1,),
    hidden_size: int = 96,
    num_layers: int = 2,
    seed: int = 0,
    max_operand: int = 99,
) -> str:
    """Build a tiny Qwen2 and warm it up on noisy addition demonstrations; return its path.

    The result is cached: a directory holding a model trained with the same
    settings is reused. Only the answer tokens are trained (prompt tokens are
    masked out of the loss).

    Args:
        label_noise: fraction of demonstrations whose answer is wrong.
        wrong_offsets: a wrong answer is ``a + b + offset`` for an offset drawn from these;
            the default, a consistent off-by-one, gives a policy torn between two answers
            that RL can resolve with one transferable preference.
    """
    from rlkit.models.tiny import train_byte_tokenizer

    settings = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "label_noise": label_noise,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "seed": seed,
        "max_operand": max_operand,
    }
    out = Path(output_dir)
    if cached(out, settings):
        return str(out)

    tokenizer = train_byte_tokenizer([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)])
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    model, tmp = fresh_model(
        out,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_positions=64,
        seed=seed,
    )
    rng = random.Random(seed)
    pairs = addition_pairs("train", max_operand=max_operand)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = [rng.choice(pairs) for _ in range(batch_size)]
        return _sft_batch(batch, tokenizer, rng, label_noise, tuple(wrong_offsets))

    supervised_warmup(model, next_batch, steps=steps, lr=lr, pad_token_id=tokenizer.pad_token_id)
    return publish(model, tmp, out, settings)


def _sft_batch(
    pairs, tokenizer, rng: random.Random, noise: float, offsets: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt answer EOS`` rows; labels are -100 except on answer + EOS."""
    rows, label_rows = [], []
    for a, b in pairs:
        prompt = tokenizer(f"{a}+{b}=", add_special_tokens=False)["input_ids"]
        answer = tokenizer(_noisy_answer(a, b, rng, noise, offsets), add_special_tokens=False)[
            "input_ids"
        ]
        answer = answer + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        label_rows.append([-100] * len(prompt) + answer)
    return right_padded(list(zip(rows, label_rows)), tokenizer.pad_token_id)
