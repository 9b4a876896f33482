"""Images of vision-language prompts: verl's ``images`` column, decoded and rendered.

A prompt row may carry ``images``: a list whose items are PNG/JPEG bytes, a file path, a
PIL image, or a mapping ``{"bytes": ..., "path": ...}`` (how ``datasets``' ``Image``
feature and verl's parquet files store one; verl's ``{"image": ...}`` is read too). Its
messages hold one ``<image>`` placeholder per image, in order. Rendering replaces each
placeholder by the model's vision tokens (``<|vision_start|>``, the image tokens,
``<|vision_end|>``) and the image by the processor's patches and grid.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

PLACEHOLDER = "<image>"
"""The marker of an image in a message's text, as verl's datasets write it."""


class ImageDataError(ValueError):
    """An image that cannot be read, or placeholders that do not match the images."""


def stored_image(value: Any) -> dict[str, Any]:
    """``value`` as the ``{"bytes", "path"}`` record the ``images`` column stores: a PIL
    image as PNG bytes, a path as itself (read when the prompt is rendered), bytes as they
    are.

    Raises:
        ImageDataError: a value of no image kind.
    """
    if isinstance(value, Mapping):
        if "image" in value and "bytes" not in value:  # verl's {"image": ...}
            return stored_image(value["image"])
        data, path = value.get("bytes"), value.get("path")
        if data is None and not path:
            raise ImageDataError("an image record has neither 'bytes' nor 'path'")
        return {"bytes": None if data is None else bytes(data), "path": path or None}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": bytes(value), "path": None}
    if isinstance(value, str | Path):
        return {"bytes": None, "path": str(value)}
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": None}
    raise ImageDataError(
        f"an image must be bytes, a path, a PIL image or {{'bytes', 'path'}}, got "
        f"{type(value).__name__}"
    )


def decode_image(value: Any) -> Any:
    """The RGB PIL image of one ``images`` item.

    Raises:
        ImageDataError: the file is missing or the bytes are no image PIL can read.
    """
    from PIL import Image, UnidentifiedImageError

    record = stored_image(value)
    source = record["bytes"]
    if source is None:
        path = Path(record["path"])
        if not path.is_file():
            raise ImageDataError(f"image file {str(path)!r} does not exist")
        source = path.read_bytes()
    try:
        with Image.open(io.BytesIO(source)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError):
        where = record["path"] or f"{len(source)} bytes"
        raise ImageDataError(f"image ({where}) is no image format PIL can read") from None


def count_placeholders(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(str(m.get("content", "")).count(PLACEHOLDER) for m in messages)


def check_placeholders(messages: Sequence[Mapping[str, Any]], num_images: int) -> None:
    """Raise unless the messages hold one ``<image>`` per image.

    Raises:
        ImageDataError: the counts differ (the message says both).
    """
    found = count_placeholders(messages)
    if found != num_images:
        raise ImageDataError(
            f"the prompt has {found} {PLACEHOLDER} placeholder(s) but {num_images} image(s); "
            f"put one {PLACEHOLDER} in the message text where each image goes"
        )


def with_vision_tokens(
    messages: Sequence[Mapping[str, Any]], start: str, pad: str, end: str
) -> list[dict[str, Any]]:
    """The messages with each ``<image>`` replaced by ``start pad end`` (one image token,
    expanded to the image's size once the text is tokenised: :func:`expand_images`)."""
    marker = f"{start}{pad}{end}"
    return [{**m, "content": str(m["content"]).replace(PLACEHOLDER, marker)} for m in messages]


def expand_images(ids: list[int], image_token: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with the i-th single image token repeated ``counts[i]`` times.

    Raises:
        ImageDataError: the ids hold a different number of image tokens than images (the
            prompt text itself contained the image token).
    """
    positions = [i for i, t in enumerate(ids) if t == image_token]
    if len(positions) != len(counts):
        raise ImageDataError(
            f"the rendered prompt holds {len(positions)} image token(s) for {len(counts)} "
            f"image(s); the prompt text must not contain the model's image token itself"
        )
    out: list[int] = []
    last = 0
    for position, count in zip(positions, counts):
        out += ids[last:position] + [image_token] * count
        last = position + 1
    return out + ids[last:]


def process_images(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The processor's ``pixel_values`` and ``image_grid_thw`` of decoded images."""
    out = processor(images=list(images), return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
