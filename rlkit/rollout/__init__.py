"""Rollout engines. Importing this package registers the built-in ones."""

from rlkit.rollout.base import (
    PolicyWeights,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    split_engine_metrics,
)

__all__ = [
    "PolicyWeights",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "split_engine_metrics",
]

# Built-in engines register themselves on import.
from rlkit.rollout import (
    embedded,  # noqa: E402,F401
    sglang,  # noqa: E402,F401
    vllm,  # noqa: E402,F401
)
