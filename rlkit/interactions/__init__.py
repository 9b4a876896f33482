"""Interactions: a simulated user that answers the policy each turn, as an environment.

An interaction is registered by name in :data:`rlkit.registry.INTERACTIONS` (or named
by ``pkg.module:factory``); the ``tool_agent`` loop builds it once per rollout from
``RolloutConfig.agent = {"interaction": name, "interaction_options": {...}}`` and
calls its :meth:`~rlkit.interactions.base.Interaction.reply` whenever the policy
answers without a tool call. Built in: ``math_tutor``.
"""

from rlkit.interactions import tutor  # noqa: F401  (registers the built-ins)
from rlkit.interactions.base import Interaction, InteractionReply, make_interaction

__all__ = ["Interaction", "InteractionReply", "make_interaction"]
