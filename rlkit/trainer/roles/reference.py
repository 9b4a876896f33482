"""The reference policy: log-probs of the initial policy, for KL penalties and PRIME."""

from __future__ import annotations

from typing import Any

from rlkit.registry import ROLES
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.actor import load_policy
from rlkit.trainer.roles.role import Role, RoleContext


@ROLES.register("reference", summary="the frozen initial policy's log-probs (KL, PRIME)")
class ReferenceRole(Role):
    """A frozen copy of the initial policy, sharded like the actor. With LoRA
    (``ModelConfig.lora_rank > 0``) there is no copy: the actor with its adapters off is
    the initial policy."""

    provides = ("ref_log_prob",)
    forward_phase = "ref"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.actor = ctx.roles["actor"]
        self.module: Any = None
        if ctx.config.model.lora_rank == 0:
            self.module, _ = ctx.backend.prepare(load_policy(ctx, trainable=False), None)

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        if self.module is not None:
            batch.extras["ref_log_prob"] = self.ctx.updater.log_probs(self.module, batch)
        else:
            actor = self.actor.module
            with self.ctx.backend.unwrap(actor).reference_context():  # LoRA: adapters off
                batch.extras["ref_log_prob"] = self.ctx.updater.log_probs(actor, batch)
        return {}
