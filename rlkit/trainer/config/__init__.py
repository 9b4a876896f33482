"""The experiment configuration: small dataclasses, every field bindable from gin.

A gin file sets fields as ``Section.field = value``, e.g.::

    AlgorithmConfig.adv_estimator = "grpo"
    RolloutConfig.n = 8

Algorithm presets (``algorithms/presets/*.gin``) only bind names and numbers
in :class:`AlgorithmConfig`; adding an algorithm never needs a trainer change.

- :mod:`~rlkit.trainer.config.models`, :mod:`~rlkit.trainer.config.data`,
  :mod:`~rlkit.trainer.config.rollout`, :mod:`~rlkit.trainer.config.training`: the
  sections, each field with its rule beside it (:func:`checked`);
- :mod:`~rlkit.trainer.config.rules`: the rules (:class:`Number`, :class:`Choice`, ...)
  and :func:`field_problems`, which applies them;
- :mod:`~rlkit.trainer.config.cross_checks`: the checks that combine fields;
- :mod:`~rlkit.trainer.config.names`: registered names and user modules, resolved early;
- :mod:`~rlkit.trainer.config.experiment`: :class:`ExperimentConfig`, which builds the
  sections from gin and runs every check.
"""

from rlkit.trainer.config.cross_checks import (
    async_depth,
    batch_problems,
    optimizer_steps_per_step,
    reward_time_problems,
    rollout_mode_problems,
)
from rlkit.trainer.config.data import DataConfig
from rlkit.trainer.config.experiment import ExperimentConfig, bound_values, format_problems
from rlkit.trainer.config.models import ModelConfig, PrimeConfig, RewardModelConfig
from rlkit.trainer.config.names import (
    IMPORT_CHECK_TIMEOUT_S,
    check_imports_alone,
    check_registered_names,
    engine_option_check,
    reward_reads_reward_model,
)
from rlkit.trainer.config.rollout import RolloutConfig
from rlkit.trainer.config.rules import (
    COUNT,
    DTYPE,
    FLAG,
    FRACTION,
    MAPPING,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    RULE,
    Choice,
    LoggerNames,
    Number,
    OfType,
    Pair,
    ResumeMode,
    Rule,
    ServerCores,
    TrackerName,
    checked,
    field_problems,
    rules_for,
)
from rlkit.trainer.config.training import (
    OPTIMIZER_IMPLEMENTATIONS,
    ROLLOUT_MODES,
    AlgorithmConfig,
    OptimConfig,
    TrainerConfig,
)

__all__ = [
    "COUNT",
    "DTYPE",
    "FLAG",
    "FRACTION",
    "IMPORT_CHECK_TIMEOUT_S",
    "MAPPING",
    "NON_NEGATIVE",
    "NON_NEGATIVE_INT",
    "OPTIMIZER_IMPLEMENTATIONS",
    "POSITIVE",
    "ROLLOUT_MODES",
    "RULE",
    "AlgorithmConfig",
    "Choice",
    "DataConfig",
    "ExperimentConfig",
    "LoggerNames",
    "ModelConfig",
    "Number",
    "OfType",
    "OptimConfig",
    "Pair",
    "PrimeConfig",
    "ResumeMode",
    "ServerCores",
    "RewardModelConfig",
    "RolloutConfig",
    "Rule",
    "TrackerName",
    "TrainerConfig",
    "async_depth",
    "batch_problems",
    "bound_values",
    "check_imports_alone",
    "check_registered_names",
    "checked",
    "engine_option_check",
    "field_problems",
    "format_problems",
    "optimizer_steps_per_step",
    "reward_reads_reward_model",
    "reward_time_problems",
    "rollout_mode_problems",
    "rules_for",
]
