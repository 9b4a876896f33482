"""The interaction interface: read the conversation, answer as the user, maybe score."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.registry import INTERACTIONS


@dataclass(frozen=True)
class InteractionReply:
    """What the simulated user does after a policy turn.

    Attributes:
        message: the user's next message; ``None`` ends the conversation.
        score: a reward for the turn just taken (placed on its last token as a token
            reward, added to the outcome reward), or ``None`` for none.
    """

    message: str | None
    score: float | None = None


class Interaction(abc.ABC):
    """A multi-turn environment that talks to the policy in the user's role.

    :meth:`reply` must be a function of its arguments (no state between calls): the
    rollout calls it for many trajectories at once, from worker threads.
    """

    @abc.abstractmethod
    def reply(
        self,
        conversation: Sequence[Mapping[str, Any]],
        *,
        ground_truth: str,
        data_source: str,
        extra_info: Mapping[str, Any],
    ) -> InteractionReply:
        """The user's answer to the conversation so far (its last message is the policy's).

        Args:
            conversation: the whole chat, prompt included, ``[{"role", "content"}, ...]``.
            ground_truth: the dataset row's reference answer.
            data_source: the row's data source.
            extra_info: the row's ``extra_info``.
        """


def make_interaction(name: str, options: Mapping[str, Any] | None = None) -> Interaction:
    """Build the interaction ``name`` (registered, or ``pkg.module:factory``).

    Raises:
        UnknownNameError: no such interaction.
        TypeError: the options do not fit the factory, or it returns no :class:`Interaction`.
    """
    factory = INTERACTIONS.get(name)
    try:
        made = factory(**dict(options or {}))
    except TypeError as exc:
        raise TypeError(
            f"interaction {name!r} does not take options {sorted(options or {})}: {exc}"
        ) from exc
    if not isinstance(made, Interaction):
        raise TypeError(
            f"interaction {name!r} built a {type(made).__name__}, not an rlkit Interaction"
        )
    return made
