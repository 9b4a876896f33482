"""A role, a loss and an estimator that check, at every call, that each receives its own
rows of the extras a role provided: used by name (``tests.extras_checks:...``) in
experiments run in this process and under ``accelerate launch``.

The role stamps each row with tensors derived from the row's own rollout log-probs (random
samples, so no two rows share them); the readers recompute the stamps from the
``rollout_log_prob`` they receive beside them. A row or a column out of place anywhere
(shares, micro-batches, trimming, packing) fails the comparison.
"""

from __future__ import annotations

import torch

import algorithms
import estimators
from rlkit.trainer.roles import Role

STAMPS = ("token_stamp", "row_stamp")


def _stamps(rollout_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Rows differ in their sampled log-probs; padding columns are 0 and add nothing.
    return 3.0 * rollout_log_prob + 1.0, rollout_log_prob.sum(-1)


def _check(token_stamp, row_stamp, rollout_log_prob, where: str) -> None:
    want_token, want_row = _stamps(rollout_log_prob)
    assert token_stamp.shape == want_token.shape, (where, token_stamp.shape, want_token.shape)
    torch.testing.assert_close(token_stamp, want_token, rtol=0, atol=0, msg=where)
    torch.testing.assert_close(row_stamp, want_row, rtol=1e-6, atol=1e-5, msg=where)


class StampRole(Role):
    """Provides ``token_stamp`` (B, T) and ``row_stamp`` (B,) from the batch's own rows."""

    provides = STAMPS
    inputs = ("rollout_log_prob",)

    def forward(self, batch):
        token, row = _stamps(batch.get("rollout_log_prob"))
        batch.extras["token_stamp"], batch.extras["row_stamp"] = token, row
        return {}


def checked_grpo(token_level_rewards, response_mask, *, token_stamp, row_stamp, **kwargs):
    """GRPO, after checking the stamps of the whole batch."""
    _check(token_stamp, row_stamp, kwargs.pop("rollout_log_prob"), "estimator")
    return estimators.get("grpo")(token_level_rewards, response_mask, **kwargs)


def checked_vanilla(
    old_log_prob, log_prob, advantages, response_mask, *, token_stamp, row_stamp, **kwargs
):
    """PPO's clip loss, after checking the micro-batch's stamps; reports ``stamps_ok``."""
    _check(token_stamp, row_stamp, kwargs.pop("rollout_log_prob"), "loss")
    loss, metrics = algorithms.get_loss("vanilla")(
        old_log_prob, log_prob, advantages, response_mask, **kwargs
    )
    metrics["stamps_ok"] = 1.0
    return loss, metrics


def register() -> None:
    """Register the checking estimator and loss (idempotent: same functions)."""
    from rlkit.registry import ESTIMATORS, POLICY_LOSSES

    inputs = (*STAMPS, "rollout_log_prob")
    ESTIMATORS.add("checked_grpo", checked_grpo, inputs=inputs)
    POLICY_LOSSES.add("checked_vanilla", checked_vanilla, inputs=inputs)


register()
