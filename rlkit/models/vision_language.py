"""Vision-language models (Qwen2-VL, Qwen2.5-VL): what rlkit needs to know about them.

A vision-language model takes, beside the token ids, each image's patches
(``pixel_values``, (patches, channels x patch area)) and grid (``image_grid_thw``, (images,
3): time, height, width in patches). Each image stands in the ids as ``k`` copies of the
image token, ``k = t * h * w / merge_size**2``; the vision tower's features replace those
tokens' embeddings. Positions are multimodal rotary ones, (3, B, L) over time, height and
width: text tokens advance all three together, an image's tokens take their place in its
grid. rlkit computes them itself, from the ids, the grids and the attention mask, with the
model's own ``get_rope_index``, so rollout and training feed the model the same positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

IMAGE_KEYS = ("pixel_values", "image_grid_thw")
"""The model inputs an image prompt carries (``Trajectory.multimodal_inputs``)."""


@dataclass(frozen=True)
class VisionTokens:
    """The special tokens of a vision-language model's ids.

    Attributes:
        image: the token that stands for one merged patch of an image.
        start, end: the tokens around each image's run of ``image`` tokens.
        merge: patches merged (per side) into one image token.
    """

    image: int
    start: int
    end: int
    merge: int

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        """How many image tokens each image of ``grid_thw`` (images, 3) stands as."""
        return (grid_thw.prod(-1) // self.merge**2).tolist()


def vision_tokens(config: Any) -> VisionTokens | None:
    """The vision tokens of a model config; ``None`` for a text-only model."""
    vision = getattr(config, "vision_config", None)
    image = getattr(config, "image_token_id", None)
    if vision is None or image is None:
        return None
    return VisionTokens(
        image=image,
        start=config.vision_start_token_id,
        end=config.vision_end_token_id,
        merge=vision.spatial_merge_size,
    )


def is_vision_language(config: Any) -> bool:
    return vision_tokens(config) is not None


def vision_trunk(model: nn.Module) -> nn.Module:
    """The part of a vision-language model that merges image features into the token
    embeddings and runs the language model: ``…ForConditionalGeneration.model``, or the
    model itself when it is that part (a critic's trunk); under peft, the wrapped one's.

    Raises:
        ValueError: ``model`` is not a vision-language model rlkit can run.
    """
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    for candidate in (base, getattr(base, "model", None)):
        if candidate is not None and hasattr(candidate, "get_rope_index"):
            return candidate
    raise ValueError(
        f"{type(base).__name__} has no multimodal positions (get_rope_index); a "
        "vision-language policy must be a transformers Qwen2-VL / Qwen2.5-VL model"
    )


def image_slots(
    trunk: nn.Module,
    input_ids: torch.Tensor,
    prompt_width: int | None = None,
    counts: Sequence[int] | None = None,
) -> torch.Tensor:
    """Where (B, L) ids hold an image's tokens: the image token within the first
    ``prompt_width`` columns (the prompts), or each row's first ``counts[row]`` image
    tokens (its images' tokens, when the prompt's end varies per row: multi-turn contexts).
    An image token a response sampled is plain text, as the rollout fed it back."""
    slots = input_ids == trunk.config.image_token_id
    if prompt_width is not None:
        slots[:, prompt_width:] = False
    if counts is not None:
        limit = torch.as_tensor(list(counts), device=slots.device)[:, None]
        slots &= slots.long().cumsum(-1) <= limit
    return slots


def rope_positions(
    trunk: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    prompt_width: int | None = None,
    counts: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary positions of (B, L) ids: ((3, B, L) positions, (B, 1) deltas).

    Padding (mask 0) is skipped, so left-padded prompts start at 0. ``delta`` is what the
    positions run ahead of (or behind) the token count: the next token after a row's
    ``n`` real tokens sits at ``n + delta`` on all three axes. ``prompt_width``, ``counts``: see
    :func:`image_slots`.
    """
    types = image_slots(trunk, input_ids, prompt_width, counts).int()
    return trunk.get_rope_index(
        input_ids,
        mm_token_type_ids=types,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
    )


def concat_images(
    rows: Sequence[Mapping[str, torch.Tensor] | None],
) -> dict[str, torch.Tensor] | None:
    """The image inputs of several rows as one batch's (the model reads images in row
    order); ``None`` when no row has images."""
    rows = [r for r in rows if r]
    if not rows:
        return None
    return {key: torch.cat([r[key] for r in rows]) for key in rows[0]}


def blank_image(vision: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """The inputs of one all-zero image of 2 x 2 patches (one merged token)."""
    channels = getattr(vision, "in_chans", None) or getattr(vision, "in_channels", 3)
    size = channels * vision.temporal_patch_size * vision.patch_size**2
    merge = vision.spatial_merge_size
    return {
        "pixel_values": torch.zeros(merge * merge, size, device=device),
        "image_grid_thw": torch.tensor([[1, merge, merge]], device=device),
    }


def image_token_counts(
    trunk: nn.Module, rows: Sequence[Mapping[str, torch.Tensor] | None]
) -> list[int]:
    """How many image tokens each row's images stand as (0 for a text row)."""
    merge = trunk.config.vision_config.spatial_merge_size
    return [0 if not r else int((r["image_grid_thw"].prod(-1) // merge**2).sum()) for r in rows]


def vision_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The vision tower's parameters (the ``visual`` module), for freezing it."""
    trunk = vision_trunk(model)
    visual = getattr(trunk, "visual", None)
    return [] if visual is None else list(visual.parameters())


def image_embeddings(
    trunk: nn.Module,
    input_ids: torch.Tensor,
    images: dict[str, torch.Tensor] | None,
    prompt_width: int | None = None,
    counts: Sequence[int] | None = None,
    keep_tower: bool = False,
) -> torch.Tensor:
    """The token embeddings of (B, L) ids with each image token's replaced by the vision
    tower's features of its image, in order: (B, L, H).

    ``keep_tower``: with no images, still run the vision tower, on one blank image whose
    features are added times zero. Under FSDP every process must run the same modules
    (each one's forward gathers its shards from all of them): a process whose rows have
    no image runs the tower with the others.

    Rollout and training both embed through here, so both feed the language model the
    same inputs. ``prompt_width``, ``counts``: see :func:`image_slots`.

    Raises:
        ValueError: the ids hold a different number of image tokens than the images'
            features (a prompt whose image tokens were cut, or images of another prompt).
    """
    embeds = trunk.get_input_embeddings()(input_ids)
    if not images and keep_tower:
        blank = blank_image(trunk.config.vision_config, embeds.device)
        features = trunk.get_image_features(**blank, return_dict=True).pooler_output
        return embeds + 0.0 * torch.cat(list(features)).sum().to(embeds.dtype)
    if not images:
        return embeds
    features = trunk.get_image_features(
        images["pixel_values"], images["image_grid_thw"], return_dict=True
    ).pooler_output
    features = torch.cat(list(features)).to(embeds.dtype)
    slots = image_slots(trunk, input_ids, prompt_width, counts)
    if int(slots.sum()) != features.shape[0]:
        raise ValueError(
            f"the rows hold {int(slots.sum())} image tokens but their images make "
            f"{features.shape[0]}; an image prompt must keep all its image tokens (never "
            f"truncate it)"
        )
    return embeds.masked_scatter(slots[..., None].expand_as(embeds), features)
