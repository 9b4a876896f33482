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

from rlkit.tasks.warmup import cached, publish, right_padded, supervised_warmup

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
    from transformers import AutoModelForImageTextToText

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
    renderer = ImagePromptRenderer.for_model(str(tmp), tokenizer)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    combos = _combinations("train")

    def next_batch() -> dict[str, Any]:
        picked = [rng.choice(combos) for _ in range(batch_size)]
        return _sft_batch(picked, renderer, tokenizer, rng, label_noise)

    supervised_warmup(
        model,
        next_batch,
        steps=steps,
        lr=lr,
        pad_token_id=tokenizer.pad_token_id,
        log_every=50,
        loss_of=lambda batch: _loss(model, batch),
    )
    return publish(model, tmp, out, settings)


def _sft_batch(combos, renderer, tokenizer, rng: random.Random, noise: float) -> dict[str, Any]:
    """Right-padded ``prompt name EOS`` rows (labels -100 but on name + EOS) and their
    pictures' inputs."""
    from rlkit.data import render_prompt
    from rlkit.models.vision_language import concat_images

    messages = renderer.messages([{"role": "user", "content": PROMPT}])
    text = render_prompt(messages, tokenizer, use_chat_template=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows, images = [], []
    for combo in combos:
        ids, inputs, _ = renderer.render(list(prompt), [_image_for(combo, rng)])
        name = tokenizer(_noisy_name(combo[0], rng, noise), add_special_tokens=False)
        answer = name["input_ids"] + [tokenizer.eos_token_id]
        rows.append((ids + answer, [-100] * len(ids) + answer))
        images.append(inputs)
    ids, labels = right_padded(rows, tokenizer.pad_token_id)
    mask = (ids != tokenizer.pad_token_id).long()  # right padding only
    return {"ids": ids, "labels": labels, "mask": mask, "images": concat_images(images)}


def _loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """The model's loss on the batch, fed as rollout and training feed it."""
    from rlkit.models.vision_language import image_embeddings, rope_positions, vision_trunk

    trunk = vision_trunk(model)
    ids, mask, images = batch["ids"], batch["mask"], batch["images"]
    positions, _ = rope_positions(trunk, ids, mask, images["image_grid_thw"])
    return model(
        inputs_embeds=image_embeddings(trunk, ids, images),
        attention_mask=mask,
        position_ids=positions,
        labels=batch["labels"],
    ).loss
