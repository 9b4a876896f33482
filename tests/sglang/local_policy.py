"""A :class:`rlkit.rollout.base.PolicyWeights` around a local transformers model (tests only).

The trainer provides the real one (``rlkit.trainer.policy_weights``); this one
lets the SGLang tests sync weights from a plain ``Qwen2ForCausalLM``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class LocalPolicyWeights:
    """Weights of ``model`` at optimizer step ``version``."""

    def __init__(self, model: torch.nn.Module, version: int) -> None:
        self.model = model
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    @contextmanager
    def generation_context(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        yield self.model, {}

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().cpu()

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
