"""Rewards: verifiable correctness rewards, shaping terms and model-based scoring.

Every reward has one contract::

    fn(response: str, ground_truth: str, **extra) -> float | dict

where a dict holds a ``"score"`` plus extra fields that get logged. Built-ins
are registered in :data:`rlkit.registry.REWARDS` when this package is imported:

- ``gsm8k`` (:mod:`rewards.gsm8k`), ``math`` (:mod:`rewards.math_answer`),
  ``exact_match`` (:mod:`rewards.exact_match`): correctness;
- ``math_dapo`` (:mod:`rewards.math_dapo`), ``hendrycks_math``
  (:mod:`rewards.hendrycks_math`), ``prime_math`` (:mod:`rewards.prime_math`), ``geo3k``
  (:mod:`rewards.geo3k`): verl's math rules, each scoring as verl does;
- ``format`` (:mod:`rewards.answer_format`), ``overlong_buffer``
  (:mod:`rewards.overlong`), ``length_penalty`` (:mod:`rewards.length_penalty`): shaping;
- ``by_data_source`` (:mod:`rewards.by_data_source`): a scorer per row chosen by its
  ``data_source``, as verl's default reward; ``default`` (same module), the
  ``DataConfig.reward`` default: the same, with ``gsm8k`` for a source it does not know;
- ``combined`` (:mod:`rewards.composition`): a correctness reward plus shaping;
- ``weighted`` (:mod:`rewards.weighted`): several rewards by weights, each logged;
- ``reward_model`` (:mod:`rewards.model_score`): the trainer's reward model's score;
- ``generative_judge`` (:mod:`rewards.generative_judge`): a judge model's parsed grade;
- ``code_unit_tests`` (:mod:`rewards.code_unit_tests`): a solution run against test
  cases in a sandboxed process.

Your own reward is any function with the contract: register it with
``@REWARDS.register("name")`` or name it as ``"my_pkg.my_module:my_reward"`` or
``"path/to/my_file.py:my_reward"``. A function with verl's signature
``(data_source, solution_str, ground_truth, extra_info=None)`` is called by keyword
(:mod:`rewards.verl_signature`). A *batched* reward scores a whole batch in one
call, ``fn(contexts, **options) -> list``: register it with ``batched=True`` or mark
it with :func:`batched` (:mod:`rewards.batched_reward`).
:func:`score_batch` scores a batch safely (time limits, errors counted);
:class:`RewardModel` scores with a trained reward model. See docs/rewards.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# Imported for their registrations.
from rewards import (  # noqa: F401
    answer_format,
    by_data_source,
    code_unit_tests,
    exact_match,
    final_turn,
    generative_judge,
    geo3k,
    gsm8k,
    hendrycks_math,
    length_penalty,
    math_answer,
    math_dapo,
    model_score,
    overlong,
    prime_math,
    weighted,
    zero,
)
from rewards.batch_scoring import BatchScores, score_batch
from rewards.batched_reward import batched, is_batched
from rewards.composition import combined, compose
from rewards.context import RewardContext
from rewards.overlong import overlong_buffer_penalty, overlong_penalty
from rewards.verl_signature import VerlReward, is_verl_reward
from rlkit.registry import REWARDS

if TYPE_CHECKING:
    from rewards.reward_model import RewardModel

__all__ = [
    "REWARDS",
    "BatchScores",
    "RewardContext",
    "RewardModel",
    "VerlReward",
    "batched",
    "combined",
    "compose",
    "get",
    "is_batched",
    "is_verl_reward",
    "names",
    "overlong_buffer_penalty",
    "overlong_penalty",
    "score_batch",
]


def get(name: str) -> Callable[..., Any]:
    """The reward registered as ``name`` (or at ``"pkg.module:function"``, or in a file:
    ``"path/to/file.py:function"``, relative to the working directory)."""
    return REWARDS.get(name)


def names() -> list[str]:
    """Sorted names of the registered rewards."""
    return REWARDS.names()


def __getattr__(name: str) -> Any:
    # RewardModel pulls in transformers; worker processes that only verify math skip it.
    if name == "RewardModel":
        from rewards.reward_model import RewardModel

        return RewardModel
    raise AttributeError(f"module 'rewards' has no attribute {name!r}")
