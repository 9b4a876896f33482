"""The critic: a value model trained alongside the policy (PPO, GAE)."""

from __future__ import annotations

from rlkit.registry import ROLES
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.role import RoleContext, TrainedRole
from rlkit.trainer.updater import value_forward


@ROLES.register("critic", summary="a value model: values before the advantages, its own update")
class CriticRole(TrainedRole):
    """The policy's trunk (or ``ModelConfig.critic_path``'s) with a scalar value head.
    Forward: V(s_t) before each response token. Update: the value loss over the same
    mini-batches as the actor's, before the actor's update."""

    provides = ("values",)
    forward_phase = "values"
    update_phase = "update_critic"
    update_order = 10
    checkpoint_name = "critic"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        from rlkit.modeling.modules import CriticModule
        from rlkit.models.loading import load_critic_backbone

        m, o = ctx.config.model, ctx.config.optim
        backbone = load_critic_backbone(
            m.critic_path or m.path, dtype=m.dtype, gguf_file=m.gguf_file
        )
        critic = CriticModule(
            backbone,
            remove_padding=m.use_remove_padding,
            share_prefix=m.share_prompt_prefix,
            sequence_parallel=ctx.backend.sequence_parallel,
        )
        self.prepare(critic, o.critic_lr)

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        batch.extras["values"] = self.ctx.updater.forward_rows(self.module, batch, value_forward)
        return {}

    def update(self, batch: TrainBatch) -> dict[str, float]:
        updater, step = self.ctx.updater, self.ctx.step()
        out, _ = updater.optimize(
            "critic",
            self.module,
            self.optimizer,
            self.scheduler,
            updater.minibatches(batch, step),
            value_forward,
            self.ctx.algorithm.critic_loss,
            step,
        )
        return out
