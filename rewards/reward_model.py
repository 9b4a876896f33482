"""Model-based reward: a sequence-classification model scores (prompt, response) pairs.

A reward model (e.g. a Bradley-Terry model, arXiv:2203.02155) is a
``AutoModelForSequenceClassification`` with one output, read at the last token.
:class:`RewardModel` builds the text the model was trained on (the tokenizer's
chat template when it has one), scores in batches, and gives the same score for
a pair whatever the batch or padding side: position ids are computed from the
attention mask, so left padding does not shift positions.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

Prompt = str | Sequence[Mapping[str, str]]


def reward_model_text(tokenizer: Any, prompt: Prompt, response: str) -> str:
    """The text a reward model scores for one (prompt, response) pair.

    The pair is re-rendered with the *reward model's* tokenizer, never the policy's
    token ids: the model was trained on its own chat format.

    Args:
        tokenizer: the reward model's tokenizer.
        prompt: a string or chat messages ``[{"role": ..., "content": ...}]``.
        response: the response text.

    Returns:
        The chat template applied to prompt + assistant response when the
        tokenizer has one; otherwise a string prompt followed directly by the response,
        or chat messages joined as ``"role: content"`` lines.
    """
    if isinstance(prompt, str) and not getattr(tokenizer, "chat_template", None):
        return prompt + response
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return conversation_text(tokenizer, [*messages, {"role": "assistant", "content": response}])


def conversation_text(tokenizer: Any, conversation: Sequence[Mapping[str, Any]]) -> str:
    """A whole conversation (ending with the assistant's last turn) as a reward model reads
    it: its chat template when it has one, else ``"role: content"`` lines. A multi-turn
    rollout's tool and user turns are rendered as the reward model's template renders them."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(conversation), tokenize=False)
    return "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in conversation)


class RewardModel:
    """Score (prompt, response) pairs with a Hugging Face reward model.

    Args:
        model_dir: a local directory (or hub name) with the model and tokenizer.
        batch_size: pairs per forward pass.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: model weights' dtype (default: float32).
        max_length: truncate longer inputs to this many tokens, dropping the
            start, so that the end of the response (where the score is read) stays.
        padding_side: ``"left"`` or ``"right"``; ``None`` keeps the tokenizer's.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        batch_size: int = 8,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_length: int | None = None,
        padding_side: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.max_length = max_length
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer.truncation_side = "left"
        if padding_side is not None:
            self.tokenizer.padding_side = padding_side
        self.model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=dtype)
        self.model.to(self.device).eval()
        self._align_pad_token()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{model_dir} has {self.model.config.num_labels} labels; a reward model has 1 "
                f"(load it with num_labels=1)"
            )
        forward = inspect.signature(self.model.forward).parameters
        self._takes_position_ids = "position_ids" in forward

    def _align_pad_token(self) -> None:
        # The model finds each row's last token by its pad id; both must agree.
        tok, config = self.tokenizer, self.model.config
        if tok.pad_token_id is None:
            if tok.eos_token_id is None:
                raise ValueError("the tokenizer has neither a pad nor an eos token; add one")
            tok.pad_token = tok.eos_token
        config.pad_token_id = tok.pad_token_id

    def text(self, prompt: Prompt, response: str) -> str:
        """The text the model scores for one pair (:func:`reward_model_text`)."""
        return reward_model_text(self.tokenizer, prompt, response)

    @torch.inference_mode()
    def _score_texts(self, texts: list[str]) -> list[float]:
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        enc = self.tokenizer(
            texts,
            padding=True,
            truncation=self.max_length is not None,
            max_length=self.max_length,
            add_special_tokens=not has_template,  # a template already adds them
            return_tensors="pt",
        ).to(self.device)
        inputs: dict[str, Any] = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
        if self._takes_position_ids:
            inputs["position_ids"] = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(**inputs).logits  # (b, 1)
        return logits[:, 0].float().cpu().tolist()

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """Score every (prompt, response) pair.

        Args:
            prompts: B prompts, each a string or chat messages.
            responses: B responses.

        Returns:
            B scores (the model's single output logit), in input order.
        """
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        texts = [self.text(p, r) for p, r in zip(prompts, responses)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            scores += self._score_texts(texts[start : start + self.batch_size])
        return scores

    __call__ = score
