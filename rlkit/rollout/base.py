"""The rollout-engine interface: token ids in, token ids and log-probs out.

Every engine (Hugging Face ``generate``, SGLang servers, ...) returns the same
:class:`RolloutBatch`, so the trainer cannot tell engines apart except by speed.
Engines are registered by name in :data:`rlkit.registry.ROLLOUT_ENGINES`; the
registered callable is a factory called by the trainer as
``factory(model_path=..., tokenizer=..., weights=..., seed=..., **engine_options)``
(``weights`` is the trainer's :class:`PolicyWeights`) returning a
:class:`RolloutEngine`; ``engine_options`` come from the gin config.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` responses are drawn for every prompt.

    ``top_k <= 0`` and ``top_p == 1`` disable those filters; ``temperature == 0``
    means greedy decoding. ``stop_token_ids`` end a response (the stop token is
    kept in the response, as EOS is).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class RolloutBatch:
    """Responses for ``len(prompt_ids) // n`` prompts, grouped contiguously.

    For prompts ``[p0, p1]`` and ``n = 2`` the rows are
    ``[p0 r0, p0 r1, p1 r0, p1 r1]`` and ``prompt_index == [0, 0, 1, 1]``.

    Attributes:
        prompt_ids: the prompt's token ids, one list per row.
        response_ids: generated token ids per row (EOS / stop token included if produced).
        rollout_log_probs: log-prob of each generated token under the sampling
            distribution (temperature, top-k and top-p applied), same lengths as
            ``response_ids``.
        finish_reasons: ``"stop"`` (EOS / stop token) or ``"length"`` per row.
        prompt_index: index of the row's prompt in the request.
        metrics: engine-side numbers (e.g. ``rollout/num_retries``), logged as is.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rollout_log_probs: list[list[float]]
    finish_reasons: list[str]
    prompt_index: list[int]
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_ids)

    def validate(self) -> None:
        """Raise ``ValueError`` if the per-row lists disagree in length."""
        n = len(self.response_ids)
        for name in ("prompt_ids", "rollout_log_probs", "finish_reasons", "prompt_index"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"RolloutBatch.{name} has {len(getattr(self, name))} rows, expected {n}"
                )
        for i, (ids, lps) in enumerate(zip(self.response_ids, self.rollout_log_probs)):
            if len(ids) != len(lps):
                raise ValueError(f"row {i}: {len(ids)} response tokens but {len(lps)} log-probs")


class PolicyWeights(Protocol):
    """What the trainer hands an engine after each update."""

    @property
    def version(self) -> int:
        """The number of optimizer steps these weights have seen."""

    def generation_context(self) -> AbstractContextManager[tuple[torch.nn.Module, dict[str, Any]]]:
        """For in-process engines: yields ``(hf_model, extra_generate_kwargs)``.

        ``hf_model`` is the trainer's live Hugging Face model (possibly sharded;
        inside the context ``hf_model.generate(**kwargs, **extra_generate_kwargs)``
        works, e.g. with ``synced_gpus=True`` under FSDP). A collective under FSDP.
        """

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) Hugging Face parameter names and tensors, on CPU.

        A collective under FSDP: every rank must iterate it; only the main
        process receives meaningful tensors.
        """

    def save_pretrained(self, path: str) -> None:
        """Write a complete Hugging Face model directory (collective under FSDP)."""


class RolloutEngine(abc.ABC):
    """Generates responses; receives new weights after each policy update."""

    #: True if the engine generates with the trainer's live module (no copy).
    shares_trainer_module: bool = False

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        """Sample ``params.n`` responses for every prompt (token ids, no padding)."""

    @abc.abstractmethod
    def sync_weights(self, weights: PolicyWeights) -> dict[str, float]:
        """Make the engine generate from ``weights``; return metrics such as
        ``timing_s/weight_sync``."""

    def restarted_servers(self) -> list[str]:
        """One line per server this engine has restarted so far (its address, how many
        times, the last failure), for the trainer's warning; engines without servers
        have none."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook, most engines own nothing
        """Release servers, processes, memory. Idempotent."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
