"""A reward model for the demo task, learned from preference pairs (Bradley-Terry).

The demo policy (:func:`~rlkit.tasks.arithmetic.arithmetic_sft_model`) is torn
between ``a+b`` and ``a+b+1``. This builds what a reward-model pipeline would: pairs
``(chosen, rejected)`` of the same prompt, the chosen answer right and the rejected
one off by a small offset, and a sequence classifier trained on them with the
Bradley-Terry loss (Ouyang et al., arXiv:2203.02155, eq. 1)::

    loss = -log sigmoid(r(x, y_chosen) - r(x, y_rejected))

The classifier starts from the demo policy's weights (as reward models start from
the SFT model) with a fresh one-output ``score`` head. It never sees the verifier:
RL against it (``experiments/reward_model_demo.gin``) is RL against a learned
preference. Like the SFT model, the result is cached by its settings.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import gin
import torch

from rlkit.tasks.arithmetic import addition_pairs, arithmetic_sft_model
from rlkit.tasks.warmup import cached


def preference_pairs(
    pairs: list[tuple[int, int]],
    rng: random.Random,
    offsets: tuple[int, ...],
    random_fraction: float = 0.0,
) -> list[tuple[str, str, str]]:
    """``(prompt, chosen, rejected)`` per (a, b): the sum, and a wrong answer: the sum plus
    an offset, or (a ``random_fraction`` of the pairs) any other number from 0 to 198."""

    def wrong(total: int) -> int:
        # No draw when the fraction is 0, so the pairs do not depend on the option's presence.
        if random_fraction > 0 and rng.random() < random_fraction:
            return rng.choice([x for x in range(199) if x != total])
        return abs(total + rng.choice(offsets))

    return [(f"{a}+{b}=", str(a + b), str(wrong(a + b))) for a, b in pairs]


def _encode(tokenizer: Any, prompt: str, answer: str) -> list[int]:
    # The text a reward model reads: the chat template over prompt + assistant answer,
    # exactly as the trainer's reward-model role renders a rollout.
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _scores(model: Any, tokenizer: Any, texts: list[tuple[str, str]]) -> torch.Tensor:
    rows = [_encode(tokenizer, p, a) for p, a in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
    # Right padding with a pad id the texts never contain: the classifier's own pooling
    # reads each row's last real token.
    return model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits[:, 0]


def pairwise_accuracy(model: Any, tokenizer: Any, pairs: list[tuple[str, str, str]]) -> float:
    """Fraction of pairs whose chosen answer scores higher than the rejected one."""
    with torch.no_grad():
        chosen = _scores(model, tokenizer, [(p, c) for p, c, _ in pairs])
        rejected = _scores(model, tokenizer, [(p, r) for p, _, r in pairs])
    return float((chosen > rejected).float().mean())


@gin.configurable
def arithmetic_reward_model(
    output_dir: str = "runs/reward_model_demo/reward_model",
    *,
    policy_dir: str | None = None,
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 1e-3,
    wrong_offsets: tuple[int, ...] = (1, -1, 2, 10),
    random_fraction: float = 0.0,
    seed: int = 0,
) -> str:
    """Train a Bradley-Terry reward model for the demo task; return its directory.

    Args:
        output_dir: where the model (with its tokenizer) is written.
        policy_dir: the model to start from (default: the demo's SFT policy, built
            or reused with its default settings).
        steps: optimizer steps of ``batch_size`` pairs from the training (a, b) pairs.
        wrong_offsets: a rejected answer is the sum plus one of these ...
        random_fraction: ... or, for this fraction of the pairs, any other number.

    The held-out pairwise accuracy (off-by-one rejected answers on the held-out
    (a, b) pairs) is printed and written to ``bradley_terry.json`` in the directory.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlkit.tasks.warmup import publish

    policy = policy_dir or arithmetic_sft_model()
    settings = {
        "policy": str(Path(policy).resolve()),
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "wrong_offsets": list(wrong_offsets),
        "random_fraction": random_fraction,
        "seed": seed,
    }
    out = Path(output_dir)
    if cached(out, settings):
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        policy, num_labels=1, pad_token_id=tokenizer.pad_token_id
    )
    rng = random.Random(seed)
    train = addition_pairs("train")

    def next_pairs() -> list[tuple[str, str, str]]:
        batch = [rng.choice(train) for _ in range(batch_size)]
        return preference_pairs(batch, rng, tuple(wrong_offsets), random_fraction)

    _train(model, tokenizer, next_pairs, steps=steps, lr=lr)
    model.eval()
    heldout = preference_pairs(addition_pairs("val"), random.Random(seed + 1), (1,))
    accuracy = pairwise_accuracy(model, tokenizer, heldout)
    print(f"[reward model] held-out pairwise accuracy {accuracy:.3f}", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    tokenizer.save_pretrained(tmp)
    path = publish(model, tmp, out, settings)
    (out / "bradley_terry.json").write_text(json.dumps({"heldout_pairwise_accuracy": accuracy}))
    return path


def _train(model: Any, tokenizer: Any, next_pairs: Any, *, steps: int, lr: float) -> None:
    """AdamW with a one-cycle schedule on the Bradley-Terry loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        pairs = next_pairs()
        chosen = _scores(model, tokenizer, [(p, c) for p, c, _ in pairs])
        rejected = _scores(model, tokenizer, [(p, r) for p, _, r in pairs])
        loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            print(f"[reward model] step {step:4d}/{steps} loss {loss.item():.4f}", flush=True)
