"""The models of a training step as role objects (:class:`Role`), registered by name in
:data:`rlkit.registry.ROLES`: ``actor``, ``reference``, ``critic``, ``reward_model``,
``implicit_prm``. The :class:`~rlkit.trainer.algorithm.Algorithm` declares which a run
needs; :mod:`rlkit.trainer.roles.role` describes the interface."""

from rlkit.trainer.roles import actor, critic, implicit_prm, reference, reward_model
from rlkit.trainer.roles.role import Role, RoleContext

__all__ = [
    "Role",
    "RoleContext",
    "actor",
    "critic",
    "implicit_prm",
    "reference",
    "reward_model",
]
