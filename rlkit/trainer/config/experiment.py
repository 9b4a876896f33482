"""The whole experiment: every section, built from gin and checked before any work."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import gin

from rlkit.trainer.config.cross_checks import (
    batch_problems,
    model_family_problems,
    position_problems,
    prime_problems,
    reward_model_problems,
    reward_time_problems,
    rollout_mode_problems,
    rollout_problems,
    sequence_parallel_problems,
    server_cores_problems,
    single_response_problems,
    source_problems,
    tensor_parallel_problems,
    vision_language_problems,
)
from rlkit.trainer.config.data import DataConfig
from rlkit.trainer.config.models import ModelConfig, PrimeConfig, RewardModelConfig
from rlkit.trainer.config.names import check_registered_names
from rlkit.trainer.config.rollout import RolloutConfig
from rlkit.trainer.config.rules import field_problems
from rlkit.trainer.config.training import AlgorithmConfig, OptimConfig, TrainerConfig


@dataclass
class ExperimentConfig:
    """All sections, each filled from the active gin bindings."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    prime: PrimeConfig = field(default_factory=PrimeConfig)

    def sections(self) -> list[Any]:
        """Every section, in the order problems are reported."""
        return [
            self.model,
            self.data,
            self.rollout,
            self.algorithm,
            self.optim,
            self.trainer,
            self.reward_model,
            self.prime,
        ]

    @classmethod
    def from_gin(cls) -> ExperimentConfig:
        """Build every section from the parsed gin bindings.

        Registered names are checked before :class:`ModelConfig` is built, because
        building it may run work bound in gin (e.g. ``@arithmetic_sft_model()``).
        """
        algorithm, data, rollout = AlgorithmConfig(), DataConfig(), RolloutConfig()
        check_registered_names(algorithm, data, rollout)
        rest = OptimConfig(), TrainerConfig(), RewardModelConfig(), PrimeConfig()
        problems = field_problems(ModelConfig, bound_values(ModelConfig))
        problems += [p for s in (data, rollout, algorithm, *rest) for p in field_problems(s)]
        problems += batch_problems(data, rest[0])
        if problems:  # the remaining checks need ModelConfig.path, so they wait for validate()
            raise ValueError(format_problems(problems))
        return cls(ModelConfig(), data, rollout, algorithm, *rest)

    def validate(self) -> None:
        """Raise ``ValueError`` naming every inconsistent setting, before any work.

        Every field's own rule (its ``rule`` metadata, :func:`~rlkit.trainer.config.rules_for`)
        is checked first; the checks that combine fields run only on fields that passed
        theirs."""
        problems = [p for section in self.sections() for p in field_problems(section)]
        problems += batch_problems(self.data, self.optim)
        problems += reward_time_problems(self.data)
        problems += rollout_problems(self.rollout)
        problems += single_response_problems(self.rollout, self.algorithm)
        problems += source_problems(self.model, self.data)
        problems += reward_model_problems(self.reward_model, self.data)
        problems += prime_problems(self.prime)
        problems += model_family_problems(self.model, self.prime)
        problems += position_problems(self.model, self.data, self.rollout)
        problems += sequence_parallel_problems(self.model, self.prime)
        problems += tensor_parallel_problems(self)
        problems += vision_language_problems(self.model, self.rollout)
        problems += rollout_mode_problems(self)
        problems += server_cores_problems(self)
        problems += data_contract_problems(self)
        if problems:
            raise ValueError(format_problems(problems))


def data_contract_problems(config: ExperimentConfig) -> list[str]:
    """Inputs the configured pieces read that nothing provides, and role options their
    roles reject (:mod:`rlkit.trainer.data_contract`); a registry name that does not
    resolve is reported as it is, once."""
    from rlkit.registry import UnknownNameError
    from rlkit.trainer.data_contract import input_problems

    try:
        return input_problems(config)
    except UnknownNameError as exc:
        return [str(exc)]


def bound_values(section: type) -> dict[str, Any]:
    """The values gin binds to ``section``'s fields, without calling anything: a binding
    to a reference (``@arithmetic_sft_model()``) is left out, so checking these can run
    before the work such a reference does."""
    values = {}
    for f in fields(section):
        try:
            value = gin.query_parameter(f"{section.__name__}.{f.name}")
        except ValueError:  # not bound
            continue
        if not isinstance(value, gin.config.ConfigurableReference):
            values[f.name] = value
    return values


def format_problems(problems: list[str]) -> str:
    """One error message listing every problem, one per line."""
    return "invalid experiment configuration:\n  - " + "\n  - ".join(problems)
