"""A tool-use task: multiplication that a tiny model gets right only with a calculator.

Prompts ask for ``a*b`` (a two-digit, b one-digit). A tiny Qwen2 warmed up on
demonstrations learns the answer format but multiplies badly on its own; with the
``calculator`` tool (called in the Qwen/Hermes format) the answer is a copy of the
tool's result. Half of the demonstrations call the tool, half answer directly, so
after the warm-up the policy calls the tool only some of the time: RL with the
``final_turn_match`` reward has to find out that calling it pays.

The chat template (:data:`TOOL_CHAT_TEMPLATE`) is a compact ChatML-like one with
the same structure as Qwen's: the assistant's turn ends with the end-of-sequence
token and a newline the policy never samples, tool results come back as ``tool``
messages, and the tools' names are rendered at the top of the prompt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import gin
import torch

from rlkit.tasks.warmup import cached, fresh_model, publish, right_padded, supervised_warmup

DATA_SOURCE = "tool_arithmetic"

TOOL_CHAT_TEMPLATE = (
    # No "{%-": it would strip the newlines that end turns; and transformers renders with
    # trim_blocks, which drops a newline right after a tag, so that one is an expression.
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}Q: {{ m.content }}\n"
    "{% elif m.role == 'assistant' %}A: {{ m.content }}</s>\n"
    "{% elif m.role == 'tool' %}R: {{ m.content }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


def tool_call_text(expression: str) -> str:
    """The policy's call of the calculator, in the Qwen/Hermes format."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def multiplication_pairs(split: str) -> list[tuple[int, int]]:
    """All (a, b), 10 <= a <= 99, 2 <= b <= 9, in ``split``: a fixed fifth is held out."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train or val, got {split!r}")
    pairs = [(a, b) for a in range(10, 100) for b in range(2, 10)]
    held = [p for p in pairs if (p[0] * 7 + p[1] * 13) % 5 == 0]
    return held if split != "train" else [p for p in pairs if p not in set(held)]


@gin.configurable
def tool_arithmetic_dataset(split: str, *, limit: int | None = None, seed: int = 0):
    """The task as a prompt-schema ``datasets.Dataset`` (id, prompt, ground_truth, data_source)."""
    from datasets import Dataset

    pairs = multiplication_pairs(split)
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:limit] if limit is not None else pairs
    return Dataset.from_list(
        [
            {
                "id": f"mul-{a}-{b}",
                "prompt": [{"role": "user", "content": f"{a}*{b}"}],
                "ground_truth": str(a * b),
                "data_source": DATA_SOURCE,
            }
            for a, b in pairs
        ]
    )


def _demonstration(tokenizer, a: int, b: int, use_tool: bool) -> tuple[list[int], list[int]]:
    """(ids, labels) of one conversation; labels are -100 except on the policy's turns."""
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    user = [{"role": "user", "content": f"{a}*{b}"}]
    prompt = tokenizer.apply_chat_template(
        user, tools=tools, tokenize=False, add_generation_prompt=True
    )
    pieces = [(prompt, False)]
    if use_tool:
        # What follows the call is what the agent loop inserts: the newline that closes the
        # turn, the tool's result and the next turn's header.
        pieces += [(tool_call_text(f"{a}*{b}") + "</s>", True), (f"\nR: {a * b}\nA: ", False)]
    pieces.append((f"{a * b}</s>", True))
    ids, labels = [], []
    for text, trained in pieces:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        labels += part if trained else [-100] * len(part)
    return ids, labels


@gin.configurable
def tool_sft_model(
    output_dir: str = "runs/tool_demo/sft_model",
    *,
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 3e-3,
    tool_rate: float = 0.5,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> str:
    """Build a tiny Qwen2 and warm it up on tool-use demonstrations; return its path.

    A fraction ``tool_rate`` of the demonstrations call the calculator and copy its
    result; the others answer directly. Cached like
    :func:`rlkit.tasks.arithmetic.arithmetic_sft_model`: a directory trained with the
    same settings is reused. ``num_heads`` sets the head width (``hidden_size /
    num_heads``): vLLM's CPU attention needs heads of 32 or wider.
    """

    from rlkit.models.tiny import train_byte_tokenizer

    settings = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "tool_rate": tool_rate,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "seed": seed,
    }
    out = Path(output_dir)
    if cached(out, settings):
        return str(out)
    tokenizer = train_byte_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    model, tmp = fresh_model(
        out,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_positions=256,
        seed=seed,
        num_heads=num_heads,
    )
    rng = random.Random(seed)
    # Every demonstration rendered once: a chat-template render per row and step would
    # cost more than the model's forward and backward.
    pairs = multiplication_pairs("train")
    demos = {
        (pair, use_tool): _demonstration(tokenizer, *pair, use_tool)
        for pair in pairs
        for use_tool in (False, True)
    }

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        rows = [demos[rng.choice(pairs), rng.random() < tool_rate] for _ in range(batch_size)]
        return right_padded(rows, tokenizer.pad_token_id)

    supervised_warmup(
        model,
        next_batch,
        steps=steps,
        lr=lr,
        pad_token_id=tokenizer.pad_token_id,
        tag="tool sft",
        log_every=200,
    )
    return publish(model, tmp, out, settings)
