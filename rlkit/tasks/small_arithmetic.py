"""Small arithmetic questions in words, for a real pretrained chat model.

``"What is 7+5?"`` asked through the model's chat template, scored by the last number of
the response (the ``gsm8k`` reward with ``method="flexible"``). SmolLM2-135M-Instruct
answers such questions right most of the time greedily but rarely when it samples at
temperature 1, where most responses wander off before they state a sum: RL without any
supervised warm-up has a reward to find and a policy that can already earn it.

Train and held-out questions are disjoint (a, op, b) triples, split by a hash as in
:mod:`rlkit.tasks.arithmetic`, so the split never depends on a seed.
"""

from __future__ import annotations

import hashlib
import random

import gin

DATA_SOURCE = "small_arithmetic"

_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def _is_held_out(a: int, op: str, b: int, held_out_percent: int) -> bool:
    digest = hashlib.sha256(f"small_arithmetic:{a}{op}{b}".encode()).hexdigest()
    return int(digest, 16) % 100 < held_out_percent


def question_triples(
    split: str,
    *,
    operations: tuple[str, ...] = ("+",),
    min_operand: int = 1,
    max_operand: int = 12,
    held_out_percent: int = 50,
) -> list[tuple[int, str, int]]:
    """All (a, op, b) with min_operand <= a, b <= max_operand in ``split`` (train | val
    | test).

    Subtraction keeps a >= b, so every answer is a natural number.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    unknown = [op for op in operations if op not in _OPERATIONS]
    if unknown:
        raise ValueError(f"unknown operations {unknown}; choose from {sorted(_OPERATIONS)}")
    held = split != "train"
    return [
        (a, op, b)
        for op in operations
        for a in range(min_operand, max_operand + 1)
        for b in range(min_operand, max_operand + 1)
        if not (op == "-" and a < b) and _is_held_out(a, op, b, held_out_percent) == held
    ]


@gin.configurable
def small_arithmetic_dataset(
    split: str,
    *,
    operations: tuple[str, ...] = ("+",),
    min_operand: int = 1,
    max_operand: int = 12,
    held_out_percent: int = 50,
    template: str = "What is {a}{op}{b}?",
    system_prompt: str | None = None,
    limit: int | None = None,
    seed: int = 0,
):
    """The task as a prompt-schema ``datasets.Dataset`` (id, prompt, ground_truth, data_source).

    Args:
        split: ``train`` or ``val``.
        operations: any of ``+``, ``-``, ``*``.
        min_operand, max_operand: the operands' range. The default 1 keeps questions
            whose answer is one of the operands (0 + b, a * 1) out, where a response
            that only repeats the question would be read as right.
        held_out_percent: the share of triples held out (a fixed hash, not a seed).
        template: the user message, with ``{a}``, ``{op}`` and ``{b}``.
        system_prompt: a system message before the question; ``None`` leaves the chat
            template's default.
        limit: keep only the first ``limit`` rows of the seeded shuffle (a random subset).
    """
    from datasets import Dataset

    triples = question_triples(
        split,
        operations=operations,
        min_operand=min_operand,
        max_operand=max_operand,
        held_out_percent=held_out_percent,
    )
    random.Random(seed).shuffle(triples)
    if limit is not None:
        triples = triples[:limit]
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return Dataset.from_list(
        [
            {
                "id": f"{DATA_SOURCE}-{a}{op}{b}",
                "prompt": system + [{"role": "user", "content": template.format(a=a, op=op, b=b)}],
                "ground_truth": str(_OPERATIONS[op](a, b)),
                "data_source": DATA_SOURCE,
            }
            for a, op, b in triples
        ]
    )
