"""rlkit's RL math beyond advantage estimation: policy losses, KL penalties and
controllers, loss aggregation, value loss, entropy and rollout IS correction.

Everything is a pure function over tensors registered by name in
``rlkit.registry`` (``POLICY_LOSSES``, ``KL_PENALTIES``, ``AGGREGATIONS``,
``VALUE_LOSSES``, ``ENTROPIES``, ``ROLLOUT_CORRECTIONS``); importing this
package registers the built-ins. Each module's docstring states its formula;
``docs/algorithms.md`` shows how the presets combine them and ``docs/differences.md``
where they differ from verl, TRL and OpenRLHF.
"""

from collections.abc import Callable
from typing import Any

import algorithms.losses  # noqa: F401  (registers the built-in policy losses)
from algorithms.aggregation import (
    aggregate_loss,
    aggregate_sequence_loss,
    global_normalizers,
    masked_mean,
)
from algorithms.entropy import entropy_from_logits
from algorithms.implicit_prm import (
    compute_dpo_abs_accuracy,
    compute_dpo_accuracy,
    dpo_opponent_q,
    implicit_prm_loss,
    implicit_process_rewards,
    implicit_q,
    reward_model_metrics,
)
from algorithms.kl import kl_penalty
from algorithms.kl_controller import (
    AdaptiveKLController,
    FixedKLController,
    make_kl_controller,
)
from algorithms.rollout_correction import rollout_is_weights
from algorithms.value_loss import value_loss  # the function; shadows the module name
from rlkit.registry import POLICY_LOSSES


def get_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name`` (or ``"package.module:function"``).

    Raises:
        UnknownNameError: unknown name; the message lists the known ones.
    """
    return POLICY_LOSSES.get(name)


def loss_names() -> list[str]:
    """Sorted names of the registered policy losses (aliases excluded)."""
    return POLICY_LOSSES.names()


__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate_loss",
    "aggregate_sequence_loss",
    "compute_dpo_abs_accuracy",
    "compute_dpo_accuracy",
    "dpo_opponent_q",
    "entropy_from_logits",
    "get_loss",
    "global_normalizers",
    "implicit_prm_loss",
    "implicit_process_rewards",
    "implicit_q",
    "kl_penalty",
    "loss_names",
    "make_kl_controller",
    "masked_mean",
    "reward_model_metrics",
    "rollout_is_weights",
    "value_loss",
]
