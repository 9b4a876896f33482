"""PRIME's implicit process reward model: token rewards from a causal LM trained online
on the step's outcomes (arXiv:2502.01456; docs/prime.md)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from rlkit.registry import ROLES
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.actor import load_policy
from rlkit.trainer.roles.role import RoleContext, TrainedRole
from rlkit.trainer.updater import policy_forward


@ROLES.register("implicit_prm", summary="PRIME's implicit PRM: token rewards, trained online")
class ImplicitPRMRole(TrainedRole):
    """A causal LM (the policy's initialisation unless ``PrimeConfig.model_path``) whose
    log-ratio to a reference gives token rewards; for another initialisation, that
    reference is its own frozen copy, else the run's reference policy.

    Its forward runs before the advantages and also takes the PRM's one optimizer step
    per RL step, in verl's order (``PrimeConfig.update``): ``before``: update, then score
    again with the updated PRM (the update's forward gives the ``*_before`` accuracies);
    ``after``: the rewards are the update's forward; ``reverse``: score, then update (the
    rewards are that score); ``none``: score with a frozen PRM.

    Provides ``process_rewards`` (what the ``prime`` estimator reads), and for its own
    update ``prm_ref_log_prob`` (the reference log-probs it scores against) and, with
    ``PrimeConfig.loss_type = "dpo"``, ``prm_opponent_q`` (B,).
    """

    provides = ("process_rewards", "prm_ref_log_prob", "prm_opponent_q")
    inputs = ("ref_log_prob",)
    forward_phase = "prm"
    checkpoint_name = "prm"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        p = ctx.config.prime
        path = p.model_path or ctx.config.model.path
        self.prepare(load_policy(ctx, trainable=True, path=path), p.lr)
        self.reference = None
        if path != ctx.config.model.path:
            self.reference, _ = ctx.backend.prepare(
                load_policy(ctx, trainable=False, path=path), None
            )

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        from algorithms import implicit_prm as prm

        p, updater = self.ctx.config.prime, self.ctx.updater
        if self.reference is not None:
            batch.extras["prm_ref_log_prob"] = updater.log_probs(self.reference, batch)
        else:
            batch.extras["prm_ref_log_prob"] = batch.get("ref_log_prob")
        # The pre-step pass: with one PRM step per RL step, the values of the update's
        # own forward, computed once here.
        metrics, q = self._score(batch, before_update=p.update in ("before", "after"))
        if p.update == "none":
            return metrics
        if p.loss_type == "dpo":
            opponent = prm.dpo_opponent_q(q, batch.acc, batch.loss_mask, batch.index)
            batch.extras["prm_opponent_q"] = opponent
        out, _ = updater.optimize(
            "reward_model",
            self.module,
            self.optimizer,
            self.scheduler,
            [batch],
            policy_forward(self.ctx.config.rollout.temperature, False),
            partial(prime_loss, p),
            self.ctx.step(),
        )
        metrics |= {prm.METRIC_LR if k == "reward_model/lr" else k: v for k, v in out.items()}
        if p.update == "before":
            metrics |= self._score(batch, before_update=False)[0]
        return metrics

    def _score(
        self, batch: TrainBatch, *, before_update: bool
    ) -> tuple[dict[str, float], torch.Tensor]:
        """Store ``process_rewards`` from the PRM as it is now; return its metrics and the
        log-ratios q."""
        from algorithms import implicit_prm as prm

        p, mask = self.ctx.config.prime, batch.loss_mask
        logp = self.ctx.updater.log_probs(self.module, batch)
        ref = batch.extras["prm_ref_log_prob"]
        rewards = prm.implicit_process_rewards(
            logp, ref, mask, beta=p.beta_train, granularity=p.granularity, norm=p.norm
        )
        batch.extras["process_rewards"] = rewards
        q = prm.implicit_q(logp, ref, mask)
        stats = prm.reward_model_metrics(
            rewards, q, batch.acc, mask, batch.index, before_update=before_update
        )
        return {k: float(v) for k, v in stats.items()}, q


def prime_loss(
    prime: Any, micro: TrainBatch, outputs: tuple[torch.Tensor, Any], norms: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
    """The implicit PRM's loss on one micro-batch (``PrimeConfig`` ``prime``; the PRM's
    forward ``outputs``): cross-entropy or DPO on the outcome labels."""
    from algorithms import implicit_prm as prm

    loss, parts = prm.implicit_prm_loss(
        outputs[0],
        micro.extras["prm_ref_log_prob"],
        micro.loss_mask,
        micro.acc,
        beta=prime.beta_train,
        loss_type=prime.loss_type,
        opponent_q=micro.extras.get("prm_opponent_q"),
        num_seqs=norms["num_seqs"],
    )
    return loss, parts, {}
