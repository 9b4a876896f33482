"""The trainer's side of weight sync: what a rollout engine may ask of the policy."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rlkit.modeling.modules import ActorModule


def _hf_name(key: str) -> str:
    """Map a wrapper state-dict key to the Hugging Face model's own parameter name."""
    key = key.removeprefix("backbone.")
    # peft wraps as base_model.model.<hf name>, with lora tensors beside the base ones.
    return key.removeprefix("base_model.model.").replace(".base_layer.", ".")


class TrainerPolicyWeights:
    """Implements :class:`rlkit.rollout.base.PolicyWeights` for the trainer's actor."""

    def __init__(
        self, backend: Any, actor: torch.nn.Module, tokenizer: Any, processor: Any = None
    ) -> None:
        self.backend = backend
        self.actor = actor
        self.tokenizer = tokenizer
        self.processor = processor  # a vision-language model's image processor
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def bump(self) -> None:
        """Called after every optimizer step of the actor."""
        self._version += 1

    @contextmanager
    def generation_context(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        with self.backend.generation_context(self.actor) as extra:
            unwrapped: ActorModule = self.backend.unwrap(self.actor)
            yield unwrapped.backbone, dict(extra or {})

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        state = self.backend.full_state_dict(self.actor)
        if any("lora_" in k for k in state):
            raise NotImplementedError(
                "syncing LoRA weights to an external engine is not supported: merge the adapters "
                "(ModelConfig.lora_rank=0) or use the in-process 'hf' engine"
            )
        for key, tensor in state.items():
            yield _hf_name(key), tensor

    def save_pretrained(self, path: str) -> None:
        self.backend.export_hf(self.actor, self.tokenizer, path, self.processor)

    def snapshot(self) -> FrozenPolicyWeights:
        """A host copy of the current weights that later updates leave alone, for a sync
        that runs while the trainer updates (rollouts ahead). One process only: under
        FSDP the module is sharded."""
        with self.generation_context() as (model, _):
            frozen = copy.deepcopy(model).to("cpu").requires_grad_(False).eval()
        return FrozenPolicyWeights(frozen, self.tokenizer, self.version)


class FrozenPolicyWeights:
    """Implements :class:`rlkit.rollout.base.PolicyWeights` for a copy of the policy taken
    at one version (:meth:`TrainerPolicyWeights.snapshot`)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, version: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    @contextmanager
    def generation_context(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        yield self.model, {}

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)
