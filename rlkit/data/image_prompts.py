"""Rendering image prompts for a vision-language model: vision tokens in the text, one
image token per merged patch in the ids, the processor's patches beside them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlkit.data.images import decode_image, expand_images, process_images, with_vision_tokens
from rlkit.models.vision_language import VisionTokens, vision_tokens


class ImagePromptRenderer:
    """Renders a prompt's messages and images the way the model reads them.

    Args:
        tokenizer: the model's tokenizer (it knows the vision tokens).
        processor: the model's image processor (``pixel_values``, ``image_grid_thw``).
        tokens: the model's vision token ids.
    """

    def __init__(self, tokenizer: Any, processor: Any, tokens: VisionTokens) -> None:
        self.processor, self.tokens = processor, tokens
        self._text = [
            tokenizer.convert_ids_to_tokens(t) for t in (tokens.start, tokens.image, tokens.end)
        ]

    @classmethod
    def for_model(cls, model_path: str, tokenizer: Any) -> ImagePromptRenderer | None:
        """The renderer of the model at ``model_path``; ``None`` for a text-only model."""
        from transformers import AutoConfig, AutoImageProcessor

        if not (Path(model_path) / "config.json").is_file():
            return None
        tokens = vision_tokens(AutoConfig.from_pretrained(model_path))
        if tokens is None:
            return None
        return cls(tokenizer, AutoImageProcessor.from_pretrained(model_path), tokens)

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages with each ``<image>`` as the model's vision tokens."""
        return with_vision_tokens(messages, *self._text)

    def render(
        self, ids: list[int], images: Sequence[Any]
    ) -> tuple[list[int], dict[str, torch.Tensor], list[Any]]:
        """The rendered prompt's ids with each image's tokens expanded, the model's image
        inputs, and the decoded images (for rewards).

        Raises:
            ImageDataError: an image cannot be decoded, or the ids do not hold one image
                token per image.
        """
        decoded = [decode_image(image) for image in images]
        inputs = process_images(self.processor, decoded)
        counts = self.tokens.tokens_per_image(inputs["image_grid_thw"])
        return expand_images(ids, self.tokens.image, counts), inputs, decoded
