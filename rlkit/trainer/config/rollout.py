"""How responses are generated: the engine, sampling, multi-turn agent loops.

The section registers with gin under ``rlkit.trainer.config``, the package that exports
it, so a binding's full name does not depend on which module defines the section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gin

from rlkit.trainer.config.rules import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    Number,
    ServerCores,
    checked,
)


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class RolloutConfig:
    """Generation: engine and sampling."""

    engine: str = "hf"
    """Rollout engine name (``hf`` | ``sglang`` | ``package.module:factory``)."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    server_cores: str | int = checked("auto", ServerCores())
    """How the cores are split between the trainer and the servers the engine starts on
    this CPU (:mod:`rlkit.rollout.servers.cpu_split`): ``"auto"`` gives the servers half
    the cores and the trainer the rest while rollouts overlap training (``rollout_mode``
    ``one_step_off`` / ``async``), ``"off"`` never splits, ``N`` gives the servers ``N``
    cores in any mode. The split is logged when the run starts."""
    n: int = checked(8, COUNT)
    """Responses per prompt (the group size)."""
    max_response_length: int = checked(256, COUNT)
    # Training samples n > 1 different responses and divides the actor's logits by
    # the temperature: 0 (greedy in the engines) would give n copies and inf logits.
    temperature: float = checked(1.0, POSITIVE)
    top_p: float = checked(1.0, Number(gt=0, le=1))
    top_k: int = checked(-1, Number(integer=True, ge=-1))  # -1 (or 0) = no top-k filter
    val_n: int = checked(1, COUNT)
    val_temperature: float = checked(0.0, NON_NEGATIVE)
    """0 = greedy validation."""
    val_top_p: float | None = checked(None, Number(gt=0, le=1, optional=True))
    """Validation's nucleus threshold (verl's ``val_kwargs.top_p``); ``None`` = ``top_p``."""
    val_top_k: int | None = checked(None, Number(integer=True, ge=-1, optional=True))
    """Validation's top-k (verl's ``val_kwargs.top_k``); ``None`` = ``top_k``."""
    val_do_sample: bool = True
    """False = greedy validation whatever ``val_temperature`` (verl's
    ``val_kwargs.do_sample``); then ``val_n`` must be 1."""
    agent_loop: str = "single_turn"
    """How a prompt becomes a trajectory (``rlkit list agent_loops``): ``single_turn`` or
    ``tool_agent`` (multi-turn tool calling), or ``pkg.module:fn``."""
    agent: dict[str, Any] = field(default_factory=dict)
    """Settings of a multi-turn loop (:class:`rlkit.rollout.agent_loop.AgentConfig`), e.g.
    ``{"tools": ["calculator"], "max_turns": 3}``. ``max_response_length`` is then the
    budget of the whole response: policy turns and tool results together."""
