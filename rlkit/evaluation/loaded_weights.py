"""A :class:`~rlkit.rollout.base.PolicyWeights` around a model loaded from a directory.

Rollout engines are written for the trainer, which hands them its live policy.
Evaluation has no trainer: this class plays the policy for a saved model. It
loads the model only when an engine first asks for it, so an engine that serves
the directory itself (SGLang) never pays for a second copy in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

#: ``--dtype auto``: half precision where an accelerator runs it fast, float32 on a CPU.
AUTO_DTYPE = {"cpu": "float32"}
DEFAULT_ACCELERATOR_DTYPE = "bfloat16"


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """``dtype`` itself, or for ``"auto"``: float32 on a CPU, bfloat16 elsewhere."""
    if dtype != "auto":
        return dtype
    return AUTO_DTYPE.get(device.type, DEFAULT_ACCELERATOR_DTYPE)


class LoadedModelWeights:
    """Evaluation-time policy weights: a Hugging Face causal LM from ``model_path``.

    Args:
        model_path: a local Hugging Face model directory.
        dtype: ``float32`` | ``bfloat16`` | ``float16`` | ``auto`` (see :func:`resolve_dtype`).
        device: where to put the model (default: the detected platform's device).
        gguf_file: a GGUF file inside ``model_path`` to dequantise instead of safetensors.
        model: an already loaded model to use instead of loading ``model_path``.
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        device: str | torch.device | None = None,
        gguf_file: str | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.device = torch.device(device) if device is not None else _default_device()
        self.dtype = resolve_dtype(dtype, self.device)
        self.gguf_file = gguf_file
        self._model = model

    @property
    def version(self) -> int:
        return 0  # never updated: evaluation does not train

    @property
    def model(self) -> torch.nn.Module:
        """The model, loaded (once) on first access, in eval mode on ``device``."""
        if self._model is None:
            from rlkit.models.loading import load_causal_lm

            model = load_causal_lm(self.model_path, dtype=self.dtype, gguf_file=self.gguf_file)
            self._model = model.to(self.device).eval()
        return self._model

    @contextmanager
    def generation_context(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        yield self.model, {}

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().cpu()

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)


def _default_device() -> torch.device:
    import rlkit.device

    return rlkit.device.current().device()
