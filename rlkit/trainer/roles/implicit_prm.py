"""PRIME's implicit process reward model: token rewards from a causal LM trained online
on the step's outcomes (arXiv:2502.01456; docs/prime.md)."""

from __future__ import annotations

from typing import Any

import torch

from rlkit.registry import ROLES
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.actor import load_policy
from rlkit.trainer.roles.role import RoleContext, TrainedRole


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
    """

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
            batch.prm_ref_log_probs = updater.log_probs(self.reference, batch)
        else:
            batch.prm_ref_log_probs = batch.ref_log_probs
        # The pre-step pass: with one PRM step per RL step, the values of the update's
        # own forward, computed once here.
        metrics, q = self._score(batch, before_update=p.update in ("before", "after"))
        if p.update == "none":
            return metrics
        if p.loss_type == "dpo":
            batch.prm_opponent_q = prm.dpo_opponent_q(q, batch.acc, batch.loss_mask, batch.index)
        out, _ = self.optimize("reward_model", [batch], self._loss)
        metrics |= {prm.METRIC_LR if k == "reward_model/lr" else k: v for k, v in out.items()}
        if p.update == "before":
            metrics |= self._score(batch, before_update=False)[0]
        return metrics

    def _score(
        self, batch: TrainBatch, *, before_update: bool
    ) -> tuple[dict[str, float], torch.Tensor]:
        """Set ``batch.process_rewards`` from the PRM as it is now; return its metrics and
        the log-ratios q."""
        from algorithms import implicit_prm as prm

        p, mask = self.ctx.config.prime, batch.loss_mask
        logp = self.ctx.updater.log_probs(self.module, batch)
        batch.process_rewards = prm.implicit_process_rewards(
            logp,
            batch.prm_ref_log_probs,
            mask,
            beta=p.beta_train,
            granularity=p.granularity,
            norm=p.norm,
        )
        q = prm.implicit_q(logp, batch.prm_ref_log_probs, mask)
        stats = prm.reward_model_metrics(
            batch.process_rewards, q, batch.acc, mask, batch.index, before_update=before_update
        )
        return {k: float(v) for k, v in stats.items()}, q

    def _loss(self, micro: TrainBatch, norms: dict[str, Any]):
        from algorithms import implicit_prm as prm

        p = self.ctx.config.prime
        logp, _ = self.module(
            micro.model_inputs(), micro.prompt_width, self.ctx.config.rollout.temperature, False
        )
        loss, parts = prm.implicit_prm_loss(
            logp,
            micro.prm_ref_log_probs,
            micro.loss_mask,
            micro.acc,
            beta=p.beta_train,
            loss_type=p.loss_type,
            opponent_q=micro.prm_opponent_q,
            num_seqs=norms["num_seqs"],
        )
        return loss, parts, {}
