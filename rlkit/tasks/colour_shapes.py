"""The vision-language demo task: name the colour of a picture.

Each image is 56 x 56 pixels of a named colour (its shade varies) with a black square
cut out of it (its size and place vary). The prompt is ``<image>colour?`` and the answer the colour's name. Train
and held-out images are disjoint (colour, place, size) combinations. The demo builds a
tiny Qwen2.5-VL and warms it up on *noisy* demonstrations (a fraction of the answers name
the next colour of :data:`COLOURS` instead), so the policy reads the picture but is torn
between two names; RL with the exact-match reward has to find out which one is right.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import gin
import torch

from rlkit.tasks.warmup import cached, publish, right_padded

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 60, 230),
    "yellow": (230, 220, 40),
    "cyan": (40, 210, 220),
    "magenta": (210, 40, 200),
}
SIDE = 56
PROMPT = "<image>colour?"
DATA_SOURCE = "colour_shapes"
#: Renders chat messages as their bare contents.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _is_held_out(colour: str, x: int, y: int, size: int) -> bool:
    # A fixed 20% of all combinations, chosen by a hash so the split needs no seed.
    key = f"{colour}-{x}-{y}-{size}".encode()
    return int(hashlib.sha256(key).hexdigest(), 16) % 5 == 0


def square_image(colour: str, x: int, y: int, size: int, shade: float = 1.0) -> Any:
    """A ``SIDE`` x ``SIDE`` RGB image of ``colour`` (scaled by ``shade``) with a black
    ``size`` square at (x, y)."""
    from PIL import Image, ImageDraw

    rgb = tuple(min(255, int(c * shade)) for c in COLOURS[colour])
    image = Image.new("RGB", (SIDE, SIDE), rgb)
    ImageDraw.Draw(image).rectangle([x, y, x + size - 1, y + size - 1], fill=(0, 0, 0))
    return image


def _combinations(split: str) -> list[tuple[str, int, int, int]]:
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train or val, got {split!r}")
    held = split != "train"
    return [
        (colour, x, y, size)
        for colour in COLOURS
        for size in (12, 18, 24)
        for x in range(0, SIDE - size + 1, 4)
        for y in range(0, SIDE - size + 1, 4)
        if _is_held_out(colour, x, y, size) == held
    ]


def _image_for(combination: tuple[str, int, int, int], rng: random.Random) -> Any:
    return square_image(*combination, shade=rng.uniform(0.7, 1.0))


@gin.configurable
def colour_dataset(split: str, *, limit: int | None = None, seed: int = 0):
    """The task as a prompt-schema ``datasets.Dataset`` with an ``images`` column.

    Args:
        split: ``train`` or ``val``.
        limit: keep only the first ``limit`` rows of the seeded shuffle.
    """
    from datasets import Dataset

    from rlkit.data.images import stored_image
    from rlkit.data.prompt_schema import IMAGE_FEATURES, encode_extra_info

    rng = random.Random(seed)
    combos = _combinations(split)
    rng.shuffle(combos)
    combos = combos[:limit] if limit is not None else combos
    rows = [
        {
            "id": f"colour-{c}-{x}-{y}-{s}",
            "prompt": [{"role": "user", "content": PROMPT}],
            "ground_truth": c,
            "data_source": DATA_SOURCE,
            "extra_info": encode_extra_info({}),
            "images": [stored_image(_image_for((c, x, y, s), rng))],
        }
        for c, x, y, s in combos
    ]
    return Dataset.from_list(rows, features=IMAGE_FEATURES)


def _noisy_name(colour: str, rng: random.Random, noise: float) -> str:
    if rng.random() >= noise:
        return colour
    names = list(COLOURS)
    return names[(names.index(colour) + 1) % len(names)]


@gin.configurable
def colour_sft_model(
    output_dir: str = "runs/vlm_demo/sft_model",
    *,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    label_noise: float = 0.5,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> str:
    """Build a tiny Qwen2.5-VL and warm it up on noisy colour names; return its path.

    Cached like :func:`rlkit.tasks.arithmetic.arithmetic_sft_model`. The warm-up feeds the
    model exactly as rollout and training do (:mod:`rlkit.models.vision_language`), and
    trains the answer tokens only.

    Args:
        label_noise: fraction of demonstrations that name the next colour instead.
    """
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from rlkit.data.image_prompts import ImagePromptRenderer
    from rlkit.models.tiny_vision_language import build_tiny_qwen2_5_vl, vision_tokenizer

    settings = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "label_noise": label_noise,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "seed": seed,
    }
    out = Path(output_dir)
    if cached(out, settings):
        return str(out)
    tokenizer = vision_tokenizer([PROMPT, *COLOURS])
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    tmp = out.with_name(out.name + ".tmp")
    build_tiny_qwen2_5_vl(
        tmp,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_image_side=SIDE,
        max_position_embeddings=64,
        seed=seed,
    )
    model = AutoModelForImageTextToText.from_pretrained(tmp)
    renderer = ImagePromptRenderer(
        tokenizer, AutoImageProcessor.from_pretrained(tmp), _tokens(model.config)
    )
    torch.manual_seed(seed)
    rng = random.Random(seed)
    combos = _combinations("train")
    _warm_up(model, renderer, tokenizer, combos, rng, settings)
    return publish(model, tmp, out, settings)


def _tokens(config: Any) -> Any:
    from rlkit.models.vision_language import vision_tokens

    return vision_tokens(config)


def _warm_up(model, renderer, tokenizer, combos, rng: random.Random, s: dict[str, Any]) -> None:
    """AdamW with a one-cycle schedule on noisy ``prompt name EOS`` rows."""
    from rlkit.data import render_prompt
    from rlkit.models.vision_language import (
        concat_images,
        image_embeddings,
        rope_positions,
        vision_trunk,
    )

    messages = renderer.messages([{"role": "user", "content": PROMPT}])
    text = render_prompt(messages, tokenizer, use_chat_template=True)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    trunk = vision_trunk(model)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=s["lr"], total_steps=s["steps"], pct_start=0.1
    )
    model.train()
    for step in range(s["steps"]):
        rows, images = [], []
        for combo in (rng.choice(combos) for _ in range(s["batch_size"])):
            ids, inputs, _ = renderer.render(list(prompt_ids), [_image_for(combo, rng)])
            name = tokenizer(
                _noisy_name(combo[0], rng, s["label_noise"]), add_special_tokens=False
            )["input_ids"] + [tokenizer.eos_token_id]
            rows.append((ids + name, [-100] * len(ids) + name))
            images.append(inputs)
        ids, labels = right_padded(rows, tokenizer.pad_token_id)
        mask = (ids != tokenizer.pad_token_id).long()  # right padding only
        batch = concat_images(images)
        positions, _ = rope_positions(trunk, ids, mask, batch["image_grid_thw"])
        loss = model(
            inputs_embeds=image_embeddings(trunk, ids, batch),
            attention_mask=mask,
            position_ids=positions,
            labels=labels,
        ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == s["steps"] - 1:
            print(f"[sft] step {step:4d}/{s['steps']} loss {loss.item():.4f}", flush=True)
