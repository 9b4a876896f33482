"""rlkit's RL math beyond advantage estimation: policy losses, KL penalties and
controllers, loss aggregation, value loss, entropy and rollout IS correction.

Everything is a pure function over tensors; all but the entropy
(``algorithms.entropy.entropy_from_logits``, called directly) are registered by name in
``rlkit.registry`` (``POLICY_LOSSES``, ``KL_PENALTIES``, ``AGGREGATIONS``,
``VALUE_LOSSES``, ``ROLLOUT_CORRECTIONS``); importing this package registers the
built-ins. Each module's docstring states its formula;
``docs/algorithms.md`` shows how the presets combine them and ``docs/differences.md``
where they differ from verl, TRL and OpenRLHF.

Every policy loss's math reads in plain torch in its own module; where a fused
version is kept for speed, it runs by default and ``set_math("plain")`` /
``with plain_math():`` select the plain one (``algorithms.math_mode``; the losses'
package docstring, ``algorithms.losses``, says which). Loop references of verl's
formulas, for tests and benchmarks, are in ``algorithms.reference``.
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
from algorithms.math_mode import get_math, plain_math, set_math
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
    "get_math",
    "global_normalizers",
    "implicit_prm_loss",
    "implicit_process_rewards",
    "implicit_q",
    "kl_penalty",
    "loss_names",
    "make_kl_controller",
    "masked_mean",
    "plain_math",
    "reward_model_metrics",
    "rollout_is_weights",
    "set_math",
    "value_loss",
]
