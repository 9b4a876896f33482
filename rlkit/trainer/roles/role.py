"""The interface every model of a training step implements.

A role is one model's part in a step: the actor (the policy being trained), the
reference policy, the critic, the reward model, PRIME's implicit process reward model,
or a user's own (a teacher for on-policy distillation, say). The
:class:`~rlkit.trainer.algorithm.Algorithm` declares which roles a run needs
(``Algorithm.roles``: the actor, every role that provides an input a configured piece
reads, and the configured ones); the trainer builds them in that order, then at every step calls

1. :meth:`Role.score` on the rollout, for roles that score responses;
2. :meth:`Role.forward` in the declared order, before the advantages (no-grad passes
   that store what the role :attr:`~Role.provides` in the
   :class:`~rlkit.trainer.batch.TrainBatch`'s extras, by name);
3. :meth:`Role.update` in ascending :attr:`Role.update_order`, after them.

It checkpoints each role's :meth:`Role.checkpoint_modules` and :meth:`Role.state_dict`
(:class:`TrainedRole` provides both for a role with its own optimizer and schedule).
A role never reaches into another through the trainer: :class:`RoleContext` hands it the
run's shared objects and the roles built before it.

A new role is a subclass registered in :data:`rlkit.registry.ROLES`, named in
``AlgorithmConfig.roles`` (a registered name or ``"path/to/file.py:Class"``); see
``docs/extending.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from rlkit.trainer import builders
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.data_contract import role_options

if TYPE_CHECKING:
    from rlkit.trainer.algorithm import Algorithm
    from rlkit.trainer.config import ExperimentConfig
    from rlkit.trainer.updater import ForwardFn, LossFn


class Backend(Protocol):
    """What a role uses of the :class:`~rlkit.trainer.backend.TrainingBackend`."""

    device: torch.device
    sequence_parallel: Any

    def prepare(self, module: torch.nn.Module, optimizer_factory: Any) -> tuple[Any, Any]:
        """Shard ``module`` (and build its optimizer from the factory, if given)."""
        ...

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside the backend's wrapper."""
        ...


class Passes(Protocol):
    """What a role uses of the :class:`~rlkit.trainer.updater.Updater`."""

    def log_probs(self, module: Any, batch: TrainBatch, *, entropy: bool = False) -> Any:
        """A policy module's (B, T) log-probs of the responses (and entropy)."""
        ...

    def forward_rows(
        self, module: Any, batch: TrainBatch, fn: Callable[[Any, TrainBatch], torch.Tensor]
    ) -> torch.Tensor:
        """``fn`` over this process's rows, gathered into (B, T, ...)."""
        ...

    def minibatches(self, batch: TrainBatch, step: int) -> list[TrainBatch]:
        """The update's mini-batches of ``batch``."""
        ...

    def optimize(
        self,
        prefix: str,
        module: Any,
        optimizer: Any,
        scheduler: Any,
        minibatches: list[TrainBatch],
        forward: ForwardFn,
        loss_fn: LossFn,
        step: int,
    ) -> tuple[dict[str, float], int]:
        """One optimizer step per mini-batch: metrics, steps applied."""
        ...


@dataclass
class RoleContext:
    """What a role is built with.

    Attributes:
        config: the :class:`~rlkit.trainer.config.ExperimentConfig`.
        backend: the run's training backend (prepare, unwrap).
        algorithm: the run's :class:`~rlkit.trainer.algorithm.Algorithm`.
        updater: the run's passes and optimizer steps (:class:`Passes`).
        tokenizer: the policy's tokenizer.
        report: prints a line on the main process.
        step: returns the number of steps trained so far.
        roles: the roles built before this one, by name.
        name: the name the role was declared under (filled in as each role is built).
    """

    config: ExperimentConfig
    backend: Backend
    algorithm: Algorithm
    updater: Passes
    tokenizer: Any
    report: Callable[[str], None]
    step: Callable[[], int]
    roles: dict[str, Role] = field(default_factory=dict)
    name: str = ""

    def options_for(self, role: type[Role]) -> Any:
        """This role's ``AlgorithmConfig.role_options`` entry: an instance of the role's
        :attr:`Role.options_type` (its defaults where none are given), or a dict when it
        declares none."""
        given = self.config.algorithm.role_options.get(self.name, {})
        return role_options(role, given)


class Role:
    """One model of a training step (see the module docstring). Every hook is optional.

    Attributes:
        provides: the tensors :meth:`forward` stores in ``batch.extras`` by name, each
            (B, T, ...) aligned with the responses or (B,) per response. Any estimator,
            loss or role can declare them as inputs; a run that reads one adds the role.
        inputs: the tensors :meth:`forward` reads (``batch.get(name)``): the batch's own
            (:data:`~rlkit.trainer.data_contract.BATCH_INPUTS`) or other roles'
            ``provides``; their providers run first.
        options_type: a dataclass of this role's settings, built from its
            ``AlgorithmConfig.role_options`` entry and checked before any model loads
            (``self.options``); ``None``: the entry as a dict.
        forward_phase: the timer phase of :meth:`forward` (``timing_s/<phase>``).
        update_phase: the timer phase of :meth:`update`.
        update_order: roles update in ascending order (the critic before the actor).
    """

    provides: ClassVar[tuple[str, ...]] = ()
    inputs: ClassVar[tuple[str, ...]] = ()
    options_type: ClassVar[type | None] = None
    forward_phase: ClassVar[str | None] = None
    update_phase: ClassVar[str | None] = None
    update_order: ClassVar[int] = 100

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self.options = ctx.options_for(type(self))

    def score(self, trajectories: list, responses: list[str], prompts: Any) -> list[float] | None:
        """This process's rollout: one score per trajectory, or None (no scoring)."""
        return None

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        """No-grad passes before the advantages, storing each of :attr:`provides` in
        ``batch.extras``; metrics."""
        return {}

    def forward_needed(self) -> bool:
        """Whether :meth:`forward` runs this step (its phase is timed as 0 when not)."""
        return True

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Optimizer steps after the advantages; metrics."""
        return {}

    def checkpoint_modules(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        """``{name: (module, optimizer or None)}`` saved in each checkpoint."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Other state saved in each checkpoint (a learning-rate schedule, say)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resume."""


class TrainedRole(Role):
    """A role with a module of its own trained by an optimizer on a learning-rate
    schedule: it checkpoints the three under :attr:`checkpoint_name`."""

    checkpoint_name: ClassVar[str] = ""

    def prepare(self, module: torch.nn.Module, lr: float) -> None:
        """Shard ``module`` with the backend and give it AdamW at ``lr`` and the run's
        schedule (``module``, ``optimizer``, ``scheduler``: what the updater's
        :meth:`~rlkit.trainer.updater.Updater.optimize` steps)."""
        o = self.ctx.config.optim
        self.module, self.optimizer = self.ctx.backend.prepare(
            module, builders.optimizer_factory(o, lr)
        )
        self.scheduler = builders.scheduler(self.optimizer, o, self.ctx.config.trainer.total_steps)

    def checkpoint_modules(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        return {self.checkpoint_name: (self.module, self.optimizer)}

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
