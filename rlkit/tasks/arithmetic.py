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
import json
import random
from pathlib import Path

import gin
import torch

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
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

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
    marker = out / "rlkit_sft.json"
    if marker.exists() and json.loads(marker.read_text()).get("settings") == settings:
        return str(out)

    from transformers import AutoModelForCausalLM

    tokenizer = train_byte_tokenizer([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)])
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    tmp = out.with_name(out.name + ".tmp")
    build_tiny_qwen2(
        tmp,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=4 * hidden_size,
        max_position_embeddings=64,
        seed=seed,
    )
    model = AutoModelForCausalLM.from_pretrained(tmp)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pairs = addition_pairs("train", max_operand=max_operand)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        batch = [rng.choice(pairs) for _ in range(batch_size)]
        ids, labels = _sft_batch(batch, tokenizer, rng, label_noise, tuple(wrong_offsets))
        loss = model(
            input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels
        ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 250 == 0 or step == steps - 1:
            print(f"[sft] step {step:4d}/{steps} loss {loss.item():.4f}", flush=True)
    model.save_pretrained(tmp)
    marker_tmp = tmp / "rlkit_sft.json"
    marker_tmp.write_text(json.dumps({"settings": settings}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return str(out)


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
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, label_rows)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    return ids, labels
