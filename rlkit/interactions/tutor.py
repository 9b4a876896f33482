"""``math_tutor``: checks each answer, says "incorrect, try again", scores the last one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.interactions.base import Interaction, InteractionReply
from rlkit.registry import INTERACTIONS, REWARDS


class MathTutor(Interaction):
    """A tutor that grades the policy's answer with a registered reward.

    A correct answer ends the conversation with score ``1 - retry_penalty * (k - 1)``
    for the ``k``-th attempt (never below 0); a wrong one gets ``feedback`` back, until
    ``max_attempts`` answers were given, when the conversation ends with score 0.
    The grade is the reward's ``acc`` (or its score when it returns a number).

    Args:
        reward: the registered reward (or ``pkg.module:fn``) that grades one answer.
        max_attempts: answers the policy may give, at least 1.
        retry_penalty: score taken off per earlier wrong attempt.
        feedback: the user's message after a wrong answer.
    """

    def __init__(
        self,
        reward: str = "final_turn_match",
        max_attempts: int = 2,
        retry_penalty: float = 0.5,
        feedback: str = "Incorrect, try again.",
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"math_tutor max_attempts must be >= 1, got {max_attempts}")
        if not 0.0 <= retry_penalty <= 1.0:
            raise ValueError(f"math_tutor retry_penalty must be in [0, 1], got {retry_penalty}")
        self.grade = REWARDS.get(reward)
        self.max_attempts, self.retry_penalty, self.feedback = (
            max_attempts,
            retry_penalty,
            feedback,
        )

    def reply(
        self,
        conversation: Sequence[Mapping[str, Any]],
        *,
        ground_truth: str,
        data_source: str,
        extra_info: Mapping[str, Any],
    ) -> InteractionReply:
        answers = [m for m in conversation if m.get("role") == "assistant"]
        attempts = (
            len(
                [
                    m
                    for m in conversation
                    if m.get("role") == "user" and m.get("content") == self.feedback
                ]
            )
            + 1
        )
        answer = str(answers[-1]["content"]) if answers else ""
        graded = self.grade(answer, ground_truth, data_source=data_source, response_length=0)
        correct = (
            float(
                graded.get("acc", graded.get("score", 0.0)) if isinstance(graded, dict) else graded
            )
            > 0
        )
        if correct:
            return InteractionReply(None, max(0.0, 1.0 - self.retry_penalty * (attempts - 1)))
        if attempts >= self.max_attempts:
            return InteractionReply(None, 0.0)
        return InteractionReply(self.feedback, 0.0)


@INTERACTIONS.register(
    "math_tutor", summary='grades each answer; "incorrect, try again" until right'
)
def math_tutor(**options: Any) -> MathTutor:
    """A :class:`MathTutor` with the given options."""
    return MathTutor(**options)
