"""Prompts as token ids, and the resumable order in which the trainer draws them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rlkit.data.image_prompts import ImagePromptRenderer
from rlkit.data.images import ImageDataError
from rlkit.data.prompt_dataset import PromptDataError


@dataclass
class PromptSet:
    """Tokenised prompts with what rewards may read about them.

    Attributes:
        token_ids: one list of ids per prompt (already truncated as configured).
        ground_truths, data_sources, ids: per prompt.
        messages: the chat messages of each prompt.
        texts: each prompt as rendered for the model (chat template applied).
        extra_infos: each row's ``extra_info`` dict (``{}`` if the dataset has none).
        multimodal: each prompt's image inputs for the model (``pixel_values``,
            ``image_grid_thw``), ``None`` for a text prompt.
        images: each prompt's decoded images (``[]`` for a text prompt), for rewards.
        num_truncated / num_filtered: prompts longer than the limit that were cut
            (left truncation keeps the end) or dropped; reported in metrics.
    """

    token_ids: list[list[int]] = field(default_factory=list)
    ground_truths: list[str] = field(default_factory=list)
    data_sources: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    extra_infos: list[dict[str, Any]] = field(default_factory=list)
    multimodal: list[dict[str, torch.Tensor] | None] = field(default_factory=list)
    images: list[list[Any]] = field(default_factory=list)
    num_truncated: int = 0
    num_filtered: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)


def tokenize_prompts(
    dataset: Any,
    tokenizer: Any,
    *,
    max_prompt_length: int,
    truncation: str,
    use_chat_template: bool,
    name: str,
    tools: list[dict[str, Any]] | None = None,
    images: ImagePromptRenderer | None = None,
) -> PromptSet:
    """Render and tokenise every row of a prompt-schema dataset.

    Args:
        dataset: rows with ``prompt`` (chat messages), ``ground_truth``, ``data_source``,
            ``id`` and optionally ``extra_info`` and ``images``.
        truncation: ``error`` (raise, naming the row), ``left`` (keep the last
            ``max_prompt_length`` tokens) or ``filter`` (drop the row). An image prompt
            is never cut (its image tokens would no longer match its image): ``left``
            raises for it too.
        name: the dataset's name for error messages (e.g. ``train``).
        tools: function-calling schemas rendered into every prompt (agent loops).
        images: the vision-language model's renderer; ``None`` for a text-only model,
            which refuses rows with images.
    """
    from rlkit.data import decode_extra_info

    out = PromptSet()
    for i, row in enumerate(dataset):
        where = f"{name} prompt {i} (id {row.get('id')!r})"
        row_images = row.get("images") or []
        if row_images and images is None:
            raise PromptDataError(
                f"{where} has {len(row_images)} image(s), but the model is text-only; set "
                f"ModelConfig.path to a vision-language model (Qwen2-VL / Qwen2.5-VL) or "
                f"drop the dataset's images column"
            )
        messages = images.messages(row["prompt"]) if row_images else row["prompt"]
        text = _render(messages, where, tokenizer, use_chat_template, tools)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        inputs, decoded = None, []
        if row_images:
            try:
                ids, inputs, decoded = images.render(ids, row_images)
            except ImageDataError as exc:
                raise PromptDataError(f"{where}: {exc}") from None
        if len(ids) > max_prompt_length:
            if truncation == "error" or (truncation == "left" and inputs is not None):
                kind = "an image prompt (never cut)" if inputs is not None else "a prompt"
                raise PromptDataError(
                    f"{where} is {kind} of {len(ids)} tokens > DataConfig.max_prompt_length="
                    f"{max_prompt_length}; raise the limit or set DataConfig.truncation to "
                    f"{'filter' if inputs is not None else 'left or filter'}"
                )
            if truncation == "filter":
                out.num_filtered += 1
                continue
            ids = ids[-max_prompt_length:]
            out.num_truncated += 1
        out.token_ids.append(ids)
        out.ground_truths.append(str(row["ground_truth"]))
        out.data_sources.append(str(row.get("data_source") or name))
        out.ids.append(str(row.get("id", i)))
        out.messages.append([dict(m) for m in row["prompt"]])
        out.texts.append(text)
        out.extra_infos.append(decode_extra_info(row.get("extra_info")))
        out.multimodal.append(inputs)
        out.images.append(decoded)
    if not out.token_ids:
        raise PromptDataError(
            f"the {name} dataset has no usable prompt: all {out.num_filtered} are longer than "
            f"DataConfig.max_prompt_length={max_prompt_length} and DataConfig.truncation="
            "'filter' dropped them; raise the limit or set DataConfig.truncation='left'"
        )
    return out


def _render(
    messages: Any,
    where: str,
    tokenizer: Any,
    use_chat_template: bool,
    tools: list[dict[str, Any]] | None,
) -> str:
    """One row's prompt text; a prompt that cannot be rendered names its row."""
    from rlkit.data import render_prompt

    try:
        return render_prompt(messages, tokenizer, use_chat_template=use_chat_template, tools=tools)
    except ValueError as exc:
        raise PromptDataError(f"{where}: {exc}") from None


class PromptSampler:
    """Epoch-wise shuffled prompt indices with a resumable position.

    The order depends only on ``seed`` and the epoch number, so a resumed run
    draws exactly the prompts the uninterrupted run would have drawn.
    """

    def __init__(self, num_prompts: int, *, seed: int, shuffle: bool = True) -> None:
        if num_prompts < 1:
            raise ValueError("cannot sample from an empty prompt set")
        self.num_prompts = num_prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_prompts, generator=g).tolist()

    def next(self, count: int) -> list[int]:
        """The next ``count`` prompt indices, continuing into the next epoch as needed."""
        out: list[int] = []
        while len(out) < count:
            order = self._order(self.epoch)
            take = order[self.position : self.position + count - len(out)]
            out += take
            self.position += len(take)
            if self.position >= self.num_prompts:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_prompts": self.num_prompts}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"checkpoint was taken on {state['num_prompts']} prompts, this run has "
                f"{self.num_prompts}: the data changed, so it cannot resume exactly"
            )
        self.epoch, self.position = state["epoch"], state["position"]
