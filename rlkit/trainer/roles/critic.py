"""The critic: a value model trained alongside the policy (PPO, GAE)."""

from __future__ import annotations

from typing import Any

from rlkit.registry import ROLES
from rlkit.trainer import builders
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.role import Role, RoleContext


@ROLES.register("critic", summary="a value model: values before the advantages, its own update")
class CriticRole(Role):
    """The policy's trunk (or ``ModelConfig.critic_path``'s) with a scalar value head.
    Forward: V(s_t) before each response token. Update: the value loss over the same
    mini-batches as the actor's, before the actor's update."""

    forward_phase = "values"
    update_phase = "update_critic"
    update_order = 10

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        from rlkit.models.loading import load_critic_backbone
        from rlkit.trainer.modules import CriticModule

        m, o = ctx.config.model, ctx.config.optim
        backbone = load_critic_backbone(
            m.critic_path or m.path, dtype=m.dtype, gguf_file=m.gguf_file
        )
        critic = CriticModule(
            backbone, remove_padding=m.use_remove_padding, share_prefix=m.share_prompt_prefix
        )
        self.module, self.optimizer = ctx.backend.prepare(
            critic, builders.optimizer_factory(o, o.critic_lr)
        )
        self.scheduler = builders.scheduler(self.optimizer, o, ctx.config.trainer.total_steps)

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        batch.values = self.ctx.updater.forward_rows(
            self.module, batch, lambda m, mb: m(mb.model_inputs(), mb.prompt_width)
        )
        return {}

    def update(self, batch: TrainBatch) -> dict[str, float]:
        step = self.ctx.step()
        out, _ = self.ctx.updater.optimize(
            "critic",
            self.module,
            self.optimizer,
            self.scheduler,
            self.ctx.updater.minibatches(batch, step),
            self._loss,
            step,
        )
        return out

    def _loss(self, micro: TrainBatch, norms: dict[str, Any]):
        vpreds = self.module(micro.model_inputs(), micro.prompt_width)
        return self.ctx.algorithm.critic_loss(micro, vpreds, norms)

    def checkpoint_modules(self) -> dict[str, tuple[Any, Any]]:
        return {"critic": (self.module, self.optimizer)}

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
