"""One response and everything the later phases need to know about how it was made.

A :class:`Trajectory` is what a rollout hands to the trainer: per response, the
prompt's token ids and every token that followed it. Not every token after the
prompt was chosen by the policy: in a multi-turn episode, tool outputs and a
simulated user's replies are inserted between the policy's turns. The
**loss mask** tells them apart (1 = sampled by the policy, trained on; 0 =
inserted, never trained on), independently of the attention mask, which
covers every real token. Padding comes later (:mod:`rlkit.trainer.batch`).

Single-turn rollouts are the special case of an all-ones loss mask; an engine's
:class:`~rlkit.rollout.base.RolloutBatch` becomes trajectories with
:func:`trajectories_from_rollout`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rlkit.rollout.base import RolloutBatch

NOT_GENERATED = -1
"""``policy_version`` of a token the policy did not sample (tool output, user turn)."""


@dataclass
class Trajectory:
    """One response to one prompt, possibly spanning several turns.

    Lengths: ``P`` prompt tokens, ``L`` response tokens (everything after the prompt).

    Attributes:
        prompt_ids: (P,) token ids of the rendered prompt.
        response_ids: (L,) token ids after the prompt, in order: the policy's own
            sampled ids (never re-tokenised) and any inserted observation ids.
        loss_mask: (L,) 0/1 per response token; 1 = sampled by the policy and trained on.
        rollout_log_probs: (L,) log-prob of each token under the sampling distribution
            where ``loss_mask`` is 1; 0.0 where it is 0 (nothing sampled it).
        policy_version: (L,) the number of optimizer steps of the weights that sampled
            each token; :data:`NOT_GENERATED` (-1) where ``loss_mask`` is 0.
        prompt_index: index of the prompt in its prompt set.
        finish_reason: ``"stop"`` (EOS / stop token), ``"length"`` (token budget) or
            another reason an agent loop names (e.g. ``"max_turns"``).
        token_rewards: (L,) rewards an environment gave at given tokens (e.g. per turn),
            or ``None``; the outcome reward is added on top when the response is scored.
        conversation: the whole chat (``[{"role", "content"}, ...]``, prompt included)
            when there were several turns; ``None`` for a single response.
        multimodal_inputs: extra model inputs of this row (e.g. ``pixel_values``,
            ``image_grid_thw``), handed to the model's forward untouched; ``None`` for text.
        stats: per-trajectory counters of the rollout (e.g. ``num_turns``,
            ``tool_calls``), summarised in the step's metrics; ``None`` for none.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_log_probs: list[float]
    policy_version: list[int]
    prompt_index: int
    finish_reason: str = "stop"
    token_rewards: list[float] | None = None
    conversation: list[dict[str, Any]] | None = None
    multimodal_inputs: Mapping[str, torch.Tensor] | None = None
    stats: dict[str, float] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    @property
    def num_generated(self) -> int:
        """Tokens the policy sampled (``sum(loss_mask)``)."""
        return sum(self.loss_mask)

    def validate(self, where: str = "trajectory") -> None:
        """Raise ``ValueError`` naming the first inconsistency.

        Checks that every per-token list has ``L`` entries, the mask is 0/1,
        log-probs are finite where generated and 0 elsewhere, and versions are
        >= 0 exactly where the mask is 1.
        """
        n = len(self.response_ids)
        per_token = {
            "loss_mask": self.loss_mask,
            "rollout_log_probs": self.rollout_log_probs,
            "policy_version": self.policy_version,
        }
        if self.token_rewards is not None:
            per_token["token_rewards"] = self.token_rewards
        for name, values in per_token.items():
            if len(values) != n:
                raise ValueError(
                    f"{where}: {n} response tokens but {len(values)} entries in {name}"
                )
        for t, (m, lp, v) in enumerate(
            zip(self.loss_mask, self.rollout_log_probs, self.policy_version)
        ):
            if m not in (0, 1):
                raise ValueError(f"{where}: loss_mask[{t}] = {m!r}, expected 0 or 1")
            if m and not (math.isfinite(lp) and v >= 0):
                raise ValueError(
                    f"{where}: token {t} is generated but has log-prob {lp} / version {v}"
                )
            if not m and (lp != 0.0 or v != NOT_GENERATED):
                raise ValueError(
                    f"{where}: token {t} was inserted (loss_mask 0) but carries a rollout "
                    f"log-prob {lp} or policy version {v}; use 0.0 and {NOT_GENERATED}"
                )


def trajectories_from_rollout(rollout: RolloutBatch, *, policy_version: int) -> list[Trajectory]:
    """Single-turn rows of an engine as trajectories: every response token is generated.

    Args:
        rollout: the engine's rows.
        policy_version: the version of the weights the engine sampled with (tokens the
            engine reports a version for in ``rollout.token_versions`` keep theirs).
    """
    rollout.validate()
    versions = rollout.token_versions or [[None] * len(r) for r in rollout.response_ids]
    return [
        Trajectory(
            prompt_ids=list(prompt),
            response_ids=list(response),
            loss_mask=[1] * len(response),
            rollout_log_probs=[float(x) for x in log_probs],
            policy_version=token_versions(row_versions, policy_version),
            prompt_index=index,
            finish_reason=reason,
        )
        for prompt, response, log_probs, reason, index, row_versions in zip(
            rollout.prompt_ids,
            rollout.response_ids,
            rollout.rollout_log_probs,
            rollout.finish_reasons,
            rollout.prompt_index,
            versions,
        )
    ]


def token_versions(reported: Sequence[int | None] | None, default: int) -> list[int]:
    """Each token's weights version: the one an engine reported, else ``default``."""
    return [default if v is None else int(v) for v in reported or ()]
