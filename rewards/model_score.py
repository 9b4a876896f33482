"""``reward_model``: the score of the trainer's reward model, as a reward.

The trainer runs the reward model (``RewardModelConfig.path``, a sequence-classification
model sharded like the reference policy) over each rollout and puts its score in the
:class:`~rewards.context.RewardContext`. This reward returns that score, so a reward
model is used like any other reward: alone (``DataConfig.reward = "reward_model"``) or
as a ``weighted`` term beside rule rewards::

    DataConfig.reward = "weighted"
    DataConfig.reward_options = {"terms": [
        {"reward": "gsm8k", "weight": 1.0},
        {"reward": "reward_model", "weight": 0.5},
    ]}
"""

from __future__ import annotations

from typing import Any

from rewards.context import RewardContext
from rlkit.registry import REWARDS


@REWARDS.register(
    "reward_model",
    summary="the score of the trainer's reward model (RewardModelConfig.path)",
    needs_reward_model=True,
)
def reward_model(
    response: str,
    ground_truth: str,
    *,
    context: RewardContext,
    scale: float = 1.0,
    shift: float = 0.0,
    **extra: Any,
) -> float:
    """``scale * (reward model score) + shift``.

    Args:
        response: ignored (the reward model has scored it).
        ground_truth: ignored.
        context: the response's context; its ``reward_model_score`` is returned.
        scale: multiplies the score (reward models' scores have arbitrary units).
        shift: added after scaling.
        **extra: ignored.

    Returns:
        The scaled score.

    Raises:
        ValueError: no reward model scored the response (``RewardModelConfig.path`` unset).
    """
    if context.reward_model_score is None:
        raise ValueError(
            "the 'reward_model' reward needs a reward model: set RewardModelConfig.path to a "
            "local AutoModelForSequenceClassification directory"
        )
    return scale * context.reward_model_score + shift
