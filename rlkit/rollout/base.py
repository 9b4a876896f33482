"""The rollout-engine interface: token ids in, token ids and log-probs out.

Every engine (Hugging Face ``generate``, SGLang servers, ...) returns the same
:class:`RolloutBatch`, so the trainer cannot tell engines apart except by speed.
Engines are registered by name in :data:`rlkit.registry.ROLLOUT_ENGINES`; the
registered callable is a factory called by the trainer as
``factory(model_path=..., tokenizer=..., weights=..., seed=..., **engine_options)``
(``weights`` is the trainer's :class:`PolicyWeights`) returning a
:class:`RolloutEngine`; ``engine_options`` come from the gin config.

An engine also declares the metric names its :class:`RolloutBatch` and turn generators
emit (:attr:`RolloutEngine.counters`, :attr:`RolloutEngine.gauges`), which
:func:`split_engine_metrics` sorts for the trainer.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from rlkit.rollout.sampling import RolloutBatch, SamplingParams
from rlkit.rollout.turns import BatchedTurns, TurnGenerator

__all__ = [
    "PolicyWeights",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "split_engine_metrics",
]


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

    counters: tuple[str, ...] = ()
    """Metric names whose values add up over processes and generation rounds: the ones
    this engine's :class:`RolloutBatch` or turn generator may emit as counts (requests
    sent, KV ids reused, ...)."""

    gauges: tuple[str, ...] = ()
    """States of the engine's servers, reported as the main process's latest value
    (servers usable, restarts so far): they do not add up over processes."""

    runs_trainer_model: bool = False
    """Whether it generates with the trainer's own (possibly split) model, so that every
    process of a tensor-parallel group must generate the same prompts in step."""

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        """Sample ``params.n`` responses for every prompt (token ids, no padding).

        An engine that generates from image prompts also takes ``multimodal=``: each
        prompt's image inputs (``pixel_values``, ``image_grid_thw``), ``None`` for a text
        prompt. Callers pass it only when a prompt has images."""

    def turns(self, params: SamplingParams) -> TurnGenerator:
        """A generator of multi-turn rollouts' turns, each sampled with ``params``
        (``n = 1``).

        By default the turns asked for together are batched through :meth:`generate`
        (:class:`~rlkit.rollout.turns.BatchedTurns`), each prefilling its whole context
        again; an engine that can keep a trajectory's context between its turns (a KV
        cache, a server's prefix cache) returns its own."""
        return BatchedTurns(self, params)

    def image_turns(self, params: SamplingParams) -> TurnGenerator:
        """A turn generator for image prompts: its ``generate`` takes each trajectory's
        image inputs (``images=``) and passes them to :meth:`generate` as ``multimodal``.
        Only engines that generate from images have one."""
        raise NotImplementedError(f"{type(self).__name__} cannot generate from image prompts")

    @abc.abstractmethod
    def sync_weights(self, weights: PolicyWeights) -> dict[str, float]:
        """Make the engine generate from ``weights``; return metrics such as
        ``timing_s/weight_sync``."""

    def sync_weights_in_flight(self, weights: PolicyWeights) -> dict[str, float]:
        """:meth:`sync_weights` under running generations, which go on with the new
        weights and report each token's version (``RolloutBatch.token_versions``).
        Engines that can say so in their registry entry (``continues_in_flight=True``);
        ``TrainerConfig.partial_rollout = "continue"`` uses it."""
        raise NotImplementedError(f"{type(self).__name__} cannot sync under a generation")

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


def split_engine_metrics(
    engine: RolloutEngine, metrics: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """``metrics`` (a rollout's, from an agent loop) as ``(counters, gauges, undeclared)``.

    ``counters`` and ``gauges`` hold the names ``engine`` declares as such
    (:attr:`RolloutEngine.counters`, :attr:`RolloutEngine.gauges`); ``undeclared`` the
    rest, which the caller should name in a warning rather than drop unseen. Per-call
    rates (names ending in ``_per_s``, e.g. ``rollout/response_tokens_per_s``) are in
    none of the three: a rate adds up over no processes or rounds, and is left in the
    engine's :class:`RolloutBatch` by design.
    """
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    undeclared: dict[str, float] = {}
    for name, value in metrics.items():
        if name in engine.counters:
            counters[name] = value
        elif name in engine.gauges:
            gauges[name] = value
        elif not name.endswith("_per_s"):
            undeclared[name] = value
    return counters, gauges, undeclared
